"""The discovery self-check of :mod:`fathom.seam`: per-example gradients add up, or refuse.

For every layer the per-example path (fast, recurrent or generic) runs on the discovery
batch and, for every covered parameter (by identity), ``sum_i g_i`` must equal autograd's
batch gradient of the same scalar ``<v, z>`` for each of two output directions ``v``
(:func:`_check_directions`; the first ``v = z``, the gradient of ``sum_i ||z_i||^2 / 2``),
entrywise within ``1e-3 (|ref| + max |ref|)``. A fast path that missed a
hook, a parameter attributed to the wrong call, or examples that interact change the
gradient itself and fail here in every precision.

**Rounding is not structure.** Below float64 the check can fail on an exact path: a gradient
that is zero in exact arithmetic (a GroupNorm of one channel per group, then a mean over the
tokens it normalized: ``sum_t x_hat_t = 0``; everything before it too) is the cancellation
of terms ``1/eps`` times larger than itself, and the batch gradient and the summed
per-example ones cancel in a different order, so they differ by about ``eps_32 sum |terms|``
while both are rounding noise of that size. A mismatch below float64 is therefore confirmed
on a float64 copy of the model (:func:`_confirmed_in_float64`): there the same noise is
``2^-29`` times smaller, far below the tolerance, so only a structural error still fails.

**Directions, stacked and one at a time.** Curvature pulls back ``D`` output directions at
once (``vmap`` over directions on the generic path, ``is_grads_batched`` in autograd), and a
batching rule of torch's can be wrong where the plain pullback is right (``torch.cdist``'s
backward under ``vmap``) or missing (``nn.PReLU``'s). So the check pulls back two directions
(:func:`_check_directions`: the checked scalar's ``grad_logits = logits`` and a fixed
pseudo-random one) one at a time, checks each against autograd's batch gradient, and then
stacked: a layer whose stacked per-example gradients (:func:`_stacked_mismatches`) fail or
differ from the looped ones takes its directions one at a time from then on
(:attr:`fathom.seam.Layer.loop_directions`); the same for the stacked pullback to the layer
outputs (:func:`_cotangents_agree`). What still differs is refused, naming the module.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from fathom.errors import FathomError
from fathom.seam.discovery import preserved
from fathom.seam.examples import close
from fathom.seam.inputs import convert, count
from fathom.seam.pex import per_example_grads
from fathom.seam.types import Call, Layer


def _adds_up(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """``|got - ref| <= 1e-3 (|ref| + max |ref|)`` entrywise (``max |ref|`` at least 1e-6)."""
    tol = 1e-3 * float(ref.detach().abs().max().clamp_min(1e-6))
    return close(got, ref, rtol=1e-3, atol=tol)


def _check_directions(logits: torch.Tensor) -> torch.Tensor:
    """``[2, N, C]``: the logits (``grad_logits`` of ``sum_i ||z_i||^2 / 2``, a generic
    direction) and a fixed pseudo-random one (its own generator: the global RNG is not drawn
    from)."""
    gen = torch.Generator().manual_seed(0)
    other = torch.randn(tuple(logits.shape), generator=gen, dtype=torch.float64)
    return torch.stack([logits.detach(), other.to(logits.dtype).to(logits.device)])


def _grads(model: nn.Module, layer: Layer, calls, cots, n: int, directions: bool = False):
    """The layer's per-example gradients; an error of ``torch.func`` propagates as is."""
    with preserved(model):
        return per_example_grads(layer, calls, cots, n, directions=directions)


def _refuse_untraceable(layer: Layer, err: Exception) -> FathomError:
    return FathomError(
        f"module {layer.name!r} ({layer.type_name}) cannot be differentiated per "
        f"example by torch.func (functional_call + vjp + vmap): "
        f"{type(err).__name__}: {str(err).splitlines()[0]}; make its forward "
        "functional (no in-place updates of captured tensors, no .item()/.tolist() "
        "control flow, no randomness) or freeze its parameters"
    )


def _mismatches(
    model: nn.Module,
    layers: tuple[Layer, ...],
    calls: dict[str, list[Call]],
    looped: list[dict[str, list[list[torch.Tensor]]]],
    totals: list[torch.Tensor],
    n: int,
) -> tuple[list[tuple[Layer, str]], dict[str, list[dict[str, torch.Tensor]]]]:
    """``(failed, grads)``: ``(layer, qualified parameter)`` of every covered parameter whose
    per-example gradients do not add up to the batch gradient of a direction's scalar
    ``totals[k]`` (``<v_k, logits>`` of ``n`` examples; ``looped[k]`` its cotangents, captured
    by the seam on that forward, module docstring), and ``grads[layer][k]`` those
    per-example gradients; a path that ``torch.func`` cannot differentiate is refused
    here, naming the module."""
    failed: list[tuple[Layer, str]] = []
    grads: dict[str, list[dict[str, torch.Tensor]]] = {}
    every = {id(t): t for layer in layers for t in layer.tensors().values()}
    batch = [  # autograd's batch gradient of each direction's scalar, every tensor at once
        dict(
            zip(
                every,
                torch.autograd.grad(
                    total, list(every.values()), allow_unused=True, retain_graph=True
                ),
                strict=True,
            )
        )
        for total in totals
    ]
    for layer in layers:
        tensors = layer.tensors()
        grads[layer.name] = []
        for total_grads, cots in zip(batch, looped, strict=True):
            want = [total_grads[id(t)] for t in tensors.values()]
            try:
                got = _grads(model, layer, calls[layer.name], cots[layer.name], n)
            except FathomError:
                raise
            except Exception as err:  # torch.func refuses: name the module and the reason
                raise _refuse_untraceable(layer, err) from err
            grads[layer.name].append(got)
            for p, q, w in zip(tensors, layer.qualified, want, strict=True):
                ok = _adds_up(got[p].sum(0), torch.zeros_like(tensors[p]) if w is None else w)
                if not ok and (layer, q) not in failed:
                    failed.append((layer, q))
    return failed, grads


def _cotangents_agree(stacked: dict, looped: list[dict]) -> bool:
    """The stacked pullback's cotangents ``[D, ...]`` equal the per-direction ones."""
    for name, calls in stacked.items():
        for c, leaves in enumerate(calls):
            for j, t in enumerate(leaves):
                if t is None:
                    continue
                for k, one in enumerate(looped):
                    if not _adds_up(t[k], one[name][c][j]):
                        return False
    return True


def _stacked_mismatches(
    model: nn.Module,
    layers: tuple[Layer, ...],
    calls: dict[str, list[Call]],
    stacked: dict[str, list[list[torch.Tensor]]],
    looped: dict[str, list[dict[str, torch.Tensor]]],
    n: int,
) -> list[Layer]:
    """The layers whose per-example gradients of the stacked directions (``stacked``
    cotangents, ``[D, ...]``) fail or differ from the per-direction ones (``looped``, from
    :func:`_mismatches`)."""
    bad = []
    for layer in layers:
        try:
            got = _grads(model, layer, calls[layer.name], stacked[layer.name], n, True)
        except FathomError:
            raise
        except Exception:  # no batching rule for an operation (nn.PReLU's backward)
            bad.append(layer)
            continue
        ref = looped[layer.name]
        if any(not _adds_up(got[p][k], one[p]) for k, one in enumerate(ref) for p in one):
            bad.append(layer)
    return bad


def _confirmed_in_float64(
    model: nn.Module, x, discover: Callable[[nn.Module, torch.Tensor], object]
) -> bool:
    """``True`` when a float64 copy of a lower-precision ``model`` passes discovery (whose
    self-check then ran in float64): the mismatch was rounding (module docstring). ``False``
    when the model is float64 already, or the copy cannot be made or is refused."""
    if all(p.dtype == torch.float64 for p in model.parameters()):
        return False
    try:
        twin = copy.deepcopy(model).double()
        discover(twin, convert(x, lambda t: t.double() if t.is_floating_point() else t))
    except Exception:  # the copy fails or is refused: the refusal stands
        return False
    return True


def _refuse_sums(layer: Layer, q: str) -> FathomError:
    return FathomError(
        f"module {layer.name!r} ({layer.type_name}, {layer.path}): per-example "
        f"gradients of parameter {q!r} do not add up to the batch gradient, so "
        "examples interact inside it or its path is not the module's function; "
        "per-example quantities are undefined for this module"
    )


def run_self_check(seam, x, discover: Callable[[nn.Module, torch.Tensor], object]) -> None:
    """The self-check of a :class:`fathom.seam.Seam` on the discovery batch ``x`` (module
    docstring): the per-direction sums, then the stacked directions, which may switch the
    seam's stacked pullback off (``seam.batched_pullback``) or a layer to one direction at
    a time (``seam.loop_directions``); refuses, naming the module, what still fails."""
    model, n = seam.model, count(x)
    with preserved(model), seam.capture() as calls, torch.enable_grad():
        logits = seam.forward(x)
    dirs = _check_directions(logits)
    totals = [(v * logits).sum() for v in dirs]
    looped = [seam.cotangents(calls, logits, v, retain_graph=True) for v in dirs]
    failed, grads = _mismatches(model, seam.layers, calls, looped, totals, n)
    if failed and not _confirmed_in_float64(model, x, discover):
        raise _refuse_sums(*failed[0])
    stacked = seam.cotangents(calls, logits, dirs, directions=True, retain_graph=True)
    if not _cotangents_agree(stacked, looped):  # autograd's is_grads_batched is wrong here
        seam.batched_pullback = False
        stacked = seam.cotangents(calls, logits, dirs, directions=True, retain_graph=True)
    bad = _stacked_mismatches(model, seam.layers, calls, stacked, grads, n)
    if not bad:
        return
    seam.loop_directions({layer.name for layer in bad})
    again = [la for la in seam.layers if la.name in {b.name for b in bad}]
    still = _stacked_mismatches(model, tuple(again), calls, stacked, grads, n)
    if still and not _confirmed_in_float64(model, x, discover):
        layer = still[0]
        raise FathomError(
            f"module {layer.name!r} ({layer.type_name}, {layer.path}): the per-example "
            "gradients of several output directions differ from those of one direction "
            "at a time, even pulled back one by one; curvature needs them to agree, so "
            "this module is refused (write its forward with operations whose backward "
            "torch.func can vmap, or freeze its parameters)"
        )
