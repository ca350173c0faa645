"""The discovery self-check of :mod:`fathom.seam`: per-example gradients add up, or refuse.

For every layer the per-example path (fast, recurrent or generic) runs on the discovery
batch and, for every covered parameter (by identity), ``sum_i g_i`` must equal autograd's
batch gradient of the same scalar (``sum_i ||z_i||^2 / 2``: ``grad_logits = logits``, a
generic direction), entrywise within ``1e-3 (|ref| + max |ref|)``. A fast path that missed a
hook, a parameter attributed to the wrong call, or examples that interact change the
gradient itself and fail here in every precision.

**Rounding is not structure.** Below float64 the check can fail on an exact path: a gradient
that is zero in exact arithmetic (a GroupNorm of one channel per group, then a mean over the
tokens it normalized: ``sum_t x_hat_t = 0``; everything before it too) is the cancellation
of terms ``1/eps`` times larger than itself, and the batch gradient and the summed
per-example ones cancel in a different order, so they differ by about ``eps_32 sum |terms|``
while both are rounding noise of that size. A mismatch below float64 is therefore confirmed
on a float64 copy of the model (:func:`confirmed_in_float64`): there the same noise is
``2^-29`` times smaller, far below the tolerance, so only a structural error still fails.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from fathom.errors import FathomError
from fathom.seam.discovery import preserved
from fathom.seam.pex import per_example_grads
from fathom.seam.types import Call, Layer


def adds_up(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """``|got - ref| <= 1e-3 (|ref| + max |ref|)`` entrywise (``max |ref|`` at least 1e-6)."""
    tol = 1e-3 * float(ref.abs().max().clamp_min(1e-6))
    return torch.allclose(got, ref, rtol=1e-3, atol=tol)


def checked_scalar(logits: torch.Tensor) -> torch.Tensor:
    """``sum_i ||z_i||^2 / 2``, the scalar whose batch and per-example gradients
    :func:`mismatches` compares (``grad_logits = logits``: a generic direction)."""
    return logits.square().sum() / 2


def mismatches(
    model: nn.Module,
    layers: tuple[Layer, ...],
    calls: dict[str, list[Call]],
    cots: dict[str, list[list[torch.Tensor]]],
    total: torch.Tensor,
    n: int,
) -> list[tuple[Layer, str]]:
    """``(layer, qualified parameter)`` of every covered parameter whose per-example
    gradients do not add up to the batch gradient of ``total`` (:func:`checked_scalar` of
    the logits of ``n`` examples; ``calls`` and ``cots`` captured on that forward by the
    seam, module docstring); a path that ``torch.func`` cannot differentiate is refused
    here, naming the module."""
    failed: list[tuple[Layer, str]] = []
    for layer in layers:
        tensors = layer.tensors()
        want = torch.autograd.grad(
            total, list(tensors.values()), allow_unused=True, retain_graph=True
        )
        try:
            with preserved(model):
                got = per_example_grads(layer, calls[layer.name], cots[layer.name], n)
        except FathomError:
            raise
        except Exception as err:  # torch.func refuses: name the module and the reason
            raise FathomError(
                f"module {layer.name!r} ({layer.type_name}) cannot be differentiated per "
                f"example by torch.func (functional_call + vjp + vmap): "
                f"{type(err).__name__}: {str(err).splitlines()[0]}; make its forward "
                "functional (no in-place updates of captured tensors, no .item()/.tolist() "
                "control flow, no randomness) or freeze its parameters"
            ) from err
        for p, q, w in zip(tensors, layer.qualified, want, strict=True):
            if not adds_up(got[p].sum(0), torch.zeros_like(tensors[p]) if w is None else w):
                failed.append((layer, q))
    return failed


def confirmed_in_float64(
    model: nn.Module, x: torch.Tensor, discover: Callable[[nn.Module, torch.Tensor], object]
) -> bool:
    """``True`` when a float64 copy of a lower-precision ``model`` passes discovery (whose
    self-check then ran in float64): the mismatch was rounding (module docstring). ``False``
    when the model is float64 already, or the copy cannot be made or is refused."""
    if all(p.dtype == torch.float64 for p in model.parameters()):
        return False
    try:
        twin = copy.deepcopy(model).double()
        discover(twin, x.double() if x.is_floating_point() else x)
    except Exception:  # the copy fails or is refused: the refusal stands
        return False
    return True
