"""Summaries of a tensor's entries: moments, exact-zero fractions, quantiles.

All reductions are over every entry (examples x units) and run in float64.
"""

from __future__ import annotations

import torch

from fathom.telemetry.field import QUANTILES, quantile_key


def entry_summary(
    t: torch.Tensor, quantiles: tuple[float, ...] = QUANTILES
) -> dict[str, float | None]:
    """``mean``, ``std`` (population, 1/n), ``rms = sqrt(mean x^2)``, ``absmax``, quantiles.

    Quantiles use linear interpolation between order statistics (``torch.quantile``'s
    default): with sorted ``x_(0) <= ... <= x_(n-1)`` and ``p = q (n - 1)``,
    ``Q(q) = x_(floor p) + (p - floor p) (x_(ceil p) - x_(floor p))``. An empty tensor gives
    ``None`` everywhere.
    """
    x = t.detach().reshape(-1).to(torch.float64)
    keys = ["mean", "std", "rms", "absmax", *(quantile_key(q) for q in quantiles)]
    if x.numel() == 0:
        return dict.fromkeys(keys)
    qs = sorted_quantiles(torch.sort(x).values, quantiles)
    head = torch.stack([x.mean(), x.std(correction=0), x.square().mean().sqrt(), x.abs().max()])
    values = torch.cat([head, qs]).tolist()  # note: one device-to-host read per tensor
    return dict(zip(keys, values, strict=True))


def sorted_quantiles(xs: torch.Tensor, quantiles: tuple[float, ...]) -> torch.Tensor:
    """Linearly interpolated quantiles of an ascending 1-D tensor (no size limit, unlike
    ``torch.quantile``)."""
    pos = torch.tensor(quantiles, dtype=torch.float64, device=xs.device) * (xs.numel() - 1)
    lo = pos.floor().long()
    hi = pos.ceil().long()
    return xs[lo] + (pos - lo.to(torch.float64)) * (xs[hi] - xs[lo])


def zero_fractions(h: torch.Tensor) -> dict[str, float | None]:
    """For activations ``h`` of shape ``(N, units)``.

    * ``zero_frac``: fraction of entries that are exactly ``0.0``;
    * ``dead_frac``: fraction of units that are exactly ``0.0`` for every one of the ``N`` rows.
    """
    if h.numel() == 0:
        return {"zero_frac": None, "dead_frac": None}
    z = h.detach().reshape(h.shape[0], -1) == 0
    zero, dead = torch.stack([z.double().mean(), z.all(dim=0).double().mean()]).tolist()
    return {"zero_frac": zero, "dead_frac": dead}
