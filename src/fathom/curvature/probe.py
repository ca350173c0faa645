"""The float64 probe model and one pullback of the ``C`` logit directions through the seam.

Curvature never touches the user's model: :func:`float64_copy` deep-copies it, converts the
copy's floating parameters and buffers to float64, makes every parameter require gradient
(curvature is defined for frozen parameters too) and puts it in **dense evaluation mode**
(``eval()``, every :class:`fathom.depth.SkippableResidual` at gain one, dropout off).
What dense evaluation means:

* **BatchNorm** normalizes with its *running* statistics, an affine map per example, so
  examples are independent and the per-example Jacobians ``J_i`` exist; its ``weight`` and
  ``bias`` are covered exactly by the seam's generic ``torch.func`` path. (In ``train()``
  mode the batch statistics couple all examples and per-example quantities are undefined.)
* **Spiking nets**: the spike is a Heaviside step whose true derivative is zero almost
  everywhere; every Jacobian here is the *surrogate* Jacobian the net trains with (what
  autograd returns), so "GGN", "Fisher" and "Jacobian Gram" are those of the surrogate
  linearization, not of the (piecewise constant) spiking function.

:func:`pull_back` runs the copy's own ``forward`` once under :meth:`fathom.seam.Seam.capture`
and pulls back the ``C`` unit logit directions ``e_c`` to every layer output in one batched
backward (the Jacobian rows); :func:`mix_cotangents` forms any other set of output
directions from them by linearity, ``J^T v = sum_c v_c J^T e_c``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fathom.depth import enter_dense
from fathom.errors import FathomError
from fathom.seam import Call, Seam
from fathom.seam.inputs import convert, count

_DTYPE = torch.float64


def float64_copy(model: nn.Module) -> nn.Module:
    """A float64, dense-evaluation copy of ``model`` with every parameter requiring grad."""
    if not isinstance(model, nn.Module):
        raise FathomError(f"curvature needs an nn.Module, got {type(model).__name__}")
    if not any(True for _ in model.parameters()):
        raise FathomError(
            f"{type(model).__name__} has no parameters: there is no curvature to compute"
        )
    twin = copy.deepcopy(model, memo=_derived_tensors(model)).to(_DTYPE)
    enter_dense(twin)
    for p in twin.parameters():
        p.requires_grad_(True)
        p.grad = None
    return twin


def _derived_tensors(model: nn.Module) -> dict[int, torch.Tensor]:
    """A ``deepcopy`` memo for the tensors a forward left as plain module attributes.

    Legacy ``torch.nn.utils.weight_norm`` and ``torch.nn.utils.prune`` recompute ``weight``
    from their parameters in a forward pre-hook and store it as a plain attribute, a
    non-leaf tensor that ``deepcopy`` refuses; the copy gets a detached clone instead (its
    next forward recomputes it from the copied parameters)."""
    return {
        id(v): v.detach().clone()
        for m in model.modules()
        for v in vars(m).values()
        if isinstance(v, torch.Tensor) and not v.is_leaf
    }


def probe_inputs(model: nn.Module, x):
    """``x`` (a tensor, a tuple or a dict of tensors: :mod:`fathom.seam.inputs`) on the
    model's device; floating inputs in float64, integer inputs (tokens) as is."""
    count(x, "curvature")
    device = next(model.parameters()).device
    return convert(
        x, lambda t: t.to(device=device, dtype=_DTYPE) if t.is_floating_point() else t.to(device)
    )


def probe_labels(y: torch.Tensor, n: int, classes: int) -> torch.Tensor:
    """Integer labels ``[N]`` in ``[0, C)``, or a :class:`FathomError` saying what is wrong."""
    if not isinstance(y, torch.Tensor) or y.shape != (n,) or y.is_floating_point():
        shape = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise FathomError(f"labels must be an integer tensor of shape [{n}], got {shape}")
    if n and (int(y.min()) < 0 or int(y.max()) >= classes):
        raise FathomError(f"labels must lie in [0, {classes}) for {classes} logits")
    return y.long()


@dataclass
class Pullback:
    """Logits ``[N, C]``, each layer's calls, and the Jacobian-row cotangents ``[C, ...]``."""

    logits: torch.Tensor
    calls: dict[str, list[Call]]
    cotangents: dict[str, list[list[torch.Tensor | None]]]
    output: torch.Tensor | None = None  # the output with its graph (``keep_graph=True``)


def unit_directions(logits: torch.Tensor) -> torch.Tensor:
    """The ``C`` unit logit directions ``e_c``, ``[C, N, C]``: their pullbacks are the Jacobian rows."""
    n, c = logits.shape
    return torch.eye(c, dtype=logits.dtype, device=logits.device)[:, None, :].expand(c, n, c)


def pull_back(
    seam: Seam,
    x,
    directions: Callable[[torch.Tensor], torch.Tensor] = unit_directions,
    keep_graph: bool = False,
) -> Pullback:
    """One forward of ``seam.model`` on ``x`` (its selected output: :meth:`Seam.forward`),
    then one batched backward of the output directions ``directions(output) [D, N, *out]``
    (default: the ``C`` units ``e_c`` of ``[N, C]`` logits) to every layer output;
    ``keep_graph`` keeps the graph (and the output, ``Pullback.output``) for further
    pullbacks of other directions on the same forward."""
    with seam.capture() as calls, torch.enable_grad():
        logits = seam.forward(x)
    if not isinstance(logits, torch.Tensor) or logits.shape[:1] != (count(x),):
        raise FathomError("the model must return logits shaped [N, classes]")
    grads = directions(logits.detach())
    cots = seam.cotangents(calls, logits, grads, directions=True, retain_graph=keep_graph)
    return Pullback(logits.detach(), calls, cots, logits if keep_graph else None)


def mix_cotangents(
    calls: list[Call], cots: list[list[torch.Tensor | None]], coeff: torch.Tensor
) -> list[list[torch.Tensor | None]]:
    """Cotangents of directions ``v_ik = sum_c coeff[i, c, k] e_c`` from the unit ones.

    ``coeff`` is ``[N, C, K]`` (``K`` directions, result ``[K, ...]``) or ``[N, C]`` (one
    direction, result without a leading dimension). Each cotangent leaf ``[C, ...]`` has
    its example dimension ``(d, k)`` (``k`` rows per example) recorded by the seam.
    """
    out = []
    for call, call_cots in zip(calls, cots, strict=True):
        mixed = []
        for t, dim in zip(call_cots, call.out_dims, strict=True):
            if t is None or dim is None:
                mixed.append(None if t is None else _no_example_dim(t, coeff))
                continue
            d, k = dim
            rows = coeff.repeat_interleave(k, dim=0)  # [N*k, C(, K)]
            moved = t.movedim(d + 1, 1)  # [C, N*k, rest...]
            flat = moved.reshape(moved.shape[0], moved.shape[1], -1)
            if coeff.dim() == 3:
                m = torch.einsum("rck,crm->krm", rows, flat).reshape(-1, *moved.shape[1:])
                mixed.append(m.movedim(1, d + 1))
            else:
                m = torch.einsum("rc,crm->rm", rows, flat).reshape(moved.shape[1:])
                mixed.append(m.movedim(0, d))
        out.append(mixed)
    return out


def _no_example_dim(t: torch.Tensor, coeff: torch.Tensor) -> torch.Tensor:
    """A leaf without an example dimension: its cotangent is zero (checked by the seam)."""
    lead = (coeff.shape[2],) if coeff.dim() == 3 else ()
    return torch.zeros(lead + t.shape[1:], dtype=t.dtype, device=t.device)
