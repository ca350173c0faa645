"""Parameter-space summaries: norms, displacement, momentum buffers, update-to-weight ratios.

All norms are Frobenius norms computed in float64. These read parameters and optimizer
state only; nothing is written.
"""

from __future__ import annotations

import torch


def frob(t: torch.Tensor | None) -> float | None:
    """``||t||_F`` in float64, ``None`` for a missing tensor."""
    if t is None:
        return None
    return float(torch.linalg.vector_norm(t.detach().to(torch.float64)))


def displacement(w: torch.Tensor, w0: torch.Tensor) -> float:
    """``||W - W_0||_F`` (distance travelled from the initial parameters)."""
    return float(
        torch.linalg.vector_norm(
            w.detach().to(torch.float64) - w0.detach().to(w.device, torch.float64)
        )
    )


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``; ``None`` if either is missing or the denominator is zero."""
    if num is None or den is None or den == 0.0:
        return None
    return num / den


def sgd_last_update_norm(
    param: torch.Tensor, optimizer: torch.optim.Optimizer, lr: float | None = None
) -> float | None:
    """``lr * ||buf||_F``: the size of the last SGD update of ``param``.

    ``lr``: the rate that update applied (the trainer passes its plan's, ``EpochContext.lr``);
    ``None`` reads the group's ``param_group["lr"]``, which a loop driving torch's optimizer and
    schedulers keeps current.

    For ``torch.optim.SGD`` with momentum ``mu > 0``, dampening 0 and no Nesterov, a step is
    ``buf <- mu buf + (g + wd W); W <- W - lr buf``, so ``lr * buf`` *is* the last update
    applied. ``None`` when the parameter has no momentum buffer (no step yet, momentum 0,
    another optimizer) or the group uses Nesterov or dampening (the update is not ``lr buf``).
    A branch skipped by stochastic depth keeps the buffer of the last step that computed it.
    """
    buf = optimizer.state.get(param, {}).get("momentum_buffer")
    if buf is None:
        return None
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            if group.get("nesterov", False) or group.get("dampening", 0.0) != 0.0:
                return None
            rate = group["lr"] if lr is None else lr
            return float(rate) * float(frob(buf))
    return None


def momentum_norm(param: torch.Tensor, optimizer: torch.optim.Optimizer) -> float | None:
    """``||buf||_F`` of the SGD momentum buffer of ``param`` (``None`` if there is none)."""
    return frob(optimizer.state.get(param, {}).get("momentum_buffer"))
