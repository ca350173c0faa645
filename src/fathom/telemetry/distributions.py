"""Summaries of a tensor's entries: moments, exact-zero fractions, quantiles.

All reductions are over every entry (examples x units) and run in float64.
"""

from __future__ import annotations

import numpy as np
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
    xs = ascending(t.detach().reshape(-1)).to(torch.float64)
    qs = sorted_quantiles(xs, quantiles)
    absmax = torch.maximum(xs[0].abs(), xs[-1].abs())  # max |x| (NaN, sorted last, propagates)
    head = torch.stack([x.mean(), x.std(correction=0), x.square().mean().sqrt(), absmax])
    values = torch.cat([head, qs]).tolist()  # note: one device-to-host read per tensor
    return dict(zip(keys, values, strict=True))


def ascending(x: torch.Tensor) -> torch.Tensor:
    """The entries of a 1-D tensor in ascending order (NaN last), in its own dtype.

    Order statistics do not depend on the dtype they are sorted in (float16/32 -> float64 is
    exact and monotone), so the float64 quantiles of the sorted entries equal those of the
    sorted float64 entries bit for bit. On the CPU numpy's sort (vectorized where the CPU
    allows) is used: about 30x faster than ``torch.sort`` on 10^5 floats.
    """
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.sort(x.numpy(force=True)))
    return torch.sort(x).values


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
