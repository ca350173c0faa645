"""The Lyapunov regularizer and the training step that keeps its two gradients apart.

Loss (classifier excluded: only the conv blocks enter λ̂)::

    L = CE + λ_reg · P,      P = mean_{b in sub-batch} (λ̂_b - λ_target)^2

with λ̂_b the maximal depth-wise Lyapunov exponent of sample ``b``
(:func:`fathom.dynamics.lyapunov.model_lyapunov`, BatchNorm in eval mode, tangents from
their own generator). The two gradients are computed separately,
``g = ∇CE + ∇(λ_reg · P)``, so their norms can be logged apart.

With ``λ_reg = 0`` the penalty is not part of the loss at all (it may still be measured,
without gradient, for the log): the parameters, optimizer state and training RNG follow
the unregularized run bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fathom.dynamics.lyapunov import model_lyapunov

DEFAULT_WEIGHT = 0.3
DEFAULT_TARGET = -0.1


def lyapunov_penalty(exponents: torch.Tensor, target: float = DEFAULT_TARGET) -> torch.Tensor:
    """``P = mean_b (λ̂_b - λ_target)^2`` over the per-sample exponents ``[B]``."""
    return (exponents - target).square().mean()


def global_norm(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    """``sqrt(Σ ||t||²)`` over the non-``None`` tensors; ``None`` when there are none."""
    present = [t for t in tensors if t is not None]
    if not present:
        return None
    return torch.linalg.vector_norm(torch.stack([t.norm() for t in present]))


@dataclass
class StepRecord:
    """One step's scalars as device tensors (read them at the epoch boundary, not per step).

    ``penalty`` / ``lyapunov`` are ``None`` when not measured; ``grad_norm_penalty`` is
    ``None`` when the penalty is not in the loss (``λ_reg = 0``).
    """

    ce: torch.Tensor
    correct: torch.Tensor
    grad_norm_ce: torch.Tensor
    grad_norm_total: torch.Tensor
    penalty: torch.Tensor | None = None
    lyapunov: torch.Tensor | None = None
    grad_norm_penalty: torch.Tensor | None = None


def regularized_gradients(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    weight: float,
    target: float = DEFAULT_TARGET,
    sub_batch: int = 16,
    measure: bool = True,
    generator: torch.Generator | None = None,
) -> StepRecord:
    """Set ``p.grad = ∇CE + ∇(weight · P)`` for every parameter; return the step's scalars.

    ``measure`` computes P (without gradient) when ``weight == 0``; it never changes the
    gradients, the running statistics or the training RNG.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    logits = model(x)
    ce = F.cross_entropy(logits, y)
    g_ce = torch.autograd.grad(ce, params)
    correct = (logits.detach().argmax(1) == y).sum()
    record = StepRecord(
        ce=ce.detach(),
        correct=correct,
        grad_norm_ce=global_norm(list(g_ce)),
        grad_norm_total=torch.zeros(()),
    )
    grads: list[torch.Tensor] = list(g_ce)
    if weight != 0.0:
        est = model_lyapunov(model, x[:sub_batch], generator=generator)
        penalty = lyapunov_penalty(est.maximal, target)
        g_pen = torch.autograd.grad(weight * penalty, params, allow_unused=True)
        record.penalty, record.lyapunov = penalty.detach(), est.maximal.detach().mean()
        record.grad_norm_penalty = global_norm(list(g_pen))
        grads = [a if b is None else a + b for a, b in zip(g_ce, g_pen)]
    elif measure:
        with torch.no_grad():
            est = model_lyapunov(model, x[:sub_batch], generator=generator)
        record.penalty = lyapunov_penalty(est.maximal, target)
        record.lyapunov = est.maximal.mean()
    for p, g in zip(params, grads):
        p.grad = g
    record.grad_norm_total = global_norm(grads)
    return record
