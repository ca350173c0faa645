"""Gradient health: input-output Jacobian spectra on health-probe examples, and spiking firing rates.

Input-output Jacobian of one health-probe example ``x_b`` (logits w.r.t. the input image), in
float64 on a float64 copy of the model in eval mode (the model itself is untouched)::

    J_b = ∂ logits(x_b) / ∂ x_b          shape [classes, C·H·W]   (surrogate derivative when spiking)

Singular values ``σ_1 >= σ_2 >= ...`` (``torch.linalg.svdvals``, float64). The numerical
rank floor is NumPy's ``matrix_rank`` rule: ``σ_i`` is numerically nonzero iff
``σ_i > σ_1 · max(m, n) · eps_float64`` (``eps = 2.22e-16``); below it a singular value is
indistinguishable from round-off and is not used. Per example::

    σ_max = σ_1,  σ_min = smallest numerically nonzero σ_i,  κ = σ_max / σ_min,
    stable rank = Σ σ_i² / σ_1²,  numerical rank = #{σ_i above the floor}

κ is therefore at most ``1 / (max(m, n) · eps)``: every κ reported is numerically
meaningful. ``σ_1 = 0`` (a Jacobian that is exactly zero) leaves σ_min, κ and stable rank
undefined (``None``). Summaries across health-probe examples are medians.

Firing rate of a spiking layer: mean of its spikes over health-probe examples, neurons and
timesteps. A layer is *silent* when its rate is below :data:`SILENT_RATE`.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from fathom.dynamics.lyapunov import eval_mode

EPS64 = float(torch.finfo(torch.float64).eps)
RANK_FLOOR_RULE = "sigma_i > sigma_max * max(m, n) * eps_float64 (numpy matrix_rank rule)"
SILENT_RATE = 1e-4
"""Silent: fewer than one spike per 10,000 neuron-timesteps on the health-probe examples."""
ILL_CONDITIONED_KAPPA = 1e6
"""κ above this (numerically meaningful, float64) is reported as ill-conditioned."""


@dataclass(frozen=True)
class SpectrumSummary:
    """One Jacobian's singular-value summary; ``None`` where undefined."""

    sigma_max: float
    sigma_min: float | None
    kappa: float | None
    stable_rank: float | None
    numerical_rank: int
    full_rank: int
    floor: float


def spectrum_summary(s: torch.Tensor, m: int, n: int) -> SpectrumSummary:
    """Summary of the singular values ``s`` (any order) of an ``m × n`` matrix (float64)."""
    s = s.to(torch.float64).sort(descending=True).values
    top = float(s[0]) if s.numel() else 0.0
    floor = top * max(m, n) * EPS64
    nonzero = s[s > floor]
    if top == 0.0 or nonzero.numel() == 0:
        return SpectrumSummary(top, None, None, None, 0, min(m, n), floor)
    low = float(nonzero[-1])
    return SpectrumSummary(
        sigma_max=top,
        sigma_min=low,
        kappa=top / low,
        stable_rank=float(s.square().sum() / (top * top)),
        numerical_rank=int(nonzero.numel()),
        full_rank=min(m, n),
        floor=floor,
    )


def input_output_jacobian(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``J[b] = ∂ logits(x_b) / ∂ x_b`` flattened to ``[B, classes, numel(x_b)]``, float64.

    Uses a float64 deep copy of ``model`` in eval mode (samples independent, so one
    backward pass per class over the summed batch gives every example's row).
    """
    model64 = copy.deepcopy(model).to(torch.float64).eval()
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    logits = model64(x64)
    rows = []
    for c in range(logits.shape[1]):
        (g,) = torch.autograd.grad(logits[:, c].sum(), x64, retain_graph=c + 1 < logits.shape[1])
        rows.append(g.flatten(1))
    return torch.stack(rows, dim=1)


def jacobian_health(model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Medians over health-probe examples of σ_max, σ_min, κ, stable rank, numerical rank.

    Keys: ``jac/sigma_max``, ``jac/sigma_min``, ``jac/kappa``, ``jac/stable_rank``,
    ``jac/numerical_rank``, ``jac/full_rank``, ``jac/examples``, ``jac/rank_floor_rule``,
    ``jac/ill_conditioned`` (median κ > :data:`ILL_CONDITIONED_KAPPA`; ``None`` when κ is
    undefined). Medians skip undefined values; all undefined gives ``None``.
    """
    jac = input_output_jacobian(model, x)
    m, n = jac.shape[1], jac.shape[2]
    sums = [spectrum_summary(s, m, n) for s in torch.linalg.svdvals(jac)]

    def median(key: str) -> float | None:
        vals = [v for v in (asdict(s)[key] for s in sums) if v is not None]
        return float(statistics.median(vals)) if vals else None

    kappa = median("kappa")
    return {
        "jac/sigma_max": median("sigma_max"),
        "jac/sigma_min": median("sigma_min"),
        "jac/kappa": kappa,
        "jac/stable_rank": median("stable_rank"),
        "jac/numerical_rank": median("numerical_rank"),
        "jac/full_rank": min(m, n),
        "jac/examples": len(sums),
        "jac/rank_floor_rule": RANK_FLOOR_RULE,
        "jac/ill_conditioned": None if kappa is None else kappa > ILL_CONDITIONED_KAPPA,
    }


def firing_rates(model: nn.Module, x: torch.Tensor) -> list[dict[str, Any]]:
    """Per spiking layer ``{"layer", "rate", "silent"}`` on health-probe inputs ``x``.

    Needs ``model.neurons()`` (``(name, module)`` pairs); only modules with a
    ``timesteps`` attribute (spiking) are measured. Eval mode, no gradient, hooks removed.
    """
    neurons = [(n, m) for n, m in getattr(model, "neurons", list)() if hasattr(m, "timesteps")]
    rates: dict[str, torch.Tensor] = {}
    handles = [
        module.register_forward_hook(
            lambda _m, _i, out, name=name: rates.__setitem__(name, out.detach().mean())
        )
        for name, module in neurons
    ]
    try:
        with torch.no_grad(), eval_mode(model):
            model(x)
    finally:
        for h in handles:
            h.remove()
    result = []
    for name, _ in neurons:
        rate = float(rates[name])  # host read, at the epoch boundary only
        result.append({"layer": name, "rate": rate, "silent": rate < SILENT_RATE})
    return result
