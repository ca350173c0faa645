"""Summaries of a tensor's entries: moments, exact-zero fractions, quantiles.

All reductions are over every entry (examples x units) and run in float64.
"""

from __future__ import annotations

import math

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
    flat = t.detach().reshape(-1)
    keys = ["mean", "std", "rms", "absmax", *(quantile_key(q) for q in quantiles)]
    if flat.numel() == 0:
        return dict.fromkeys(keys)
    x = flat.to(torch.float64)
    head = torch.stack([x.mean(), x.std(correction=0), x.square().mean().sqrt()]).tolist()
    xs = ascending(flat)
    n = int(xs.numel())
    pos = [q * (n - 1) for q in quantiles]
    ranks = sorted({0, n - 1, *(math.floor(p) for p in pos), *(math.ceil(p) for p in pos)})
    picked = xs[torch.tensor(ranks, device=xs.device)].tolist()  # note: one host read
    order = dict(zip(ranks, picked, strict=True))
    lo, hi = order[0], order[n - 1]
    absmax = hi if math.isnan(hi) else max(abs(lo), abs(hi))  # max |x| (NaN sorts last)
    # Q(q) in Python floats: IEEE float64, the same operations in the same order as the
    # tensor formula (tests/test_telemetry.py compares the two bit for bit)
    qs = [
        order[math.floor(p)] + (p - math.floor(p)) * (order[math.ceil(p)] - order[math.floor(p)])
        for p in pos
    ]
    return dict(zip(keys, [*head, absmax, *qs], strict=True))


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


def zero_fractions(h: torch.Tensor) -> dict[str, float | None]:
    """For activations ``h`` of shape ``(N, units)``.

    * ``zero_frac``: fraction of entries that are exactly ``0.0``;
    * ``dead_frac``: fraction of units that are exactly ``0.0`` for every one of the ``N`` rows.
    """
    if h.numel() == 0:
        return {"zero_frac": None, "dead_frac": None}
    z = h.detach().reshape(h.shape[0], -1) == 0
    zeros, dead = torch.stack([z.sum(), z.all(dim=0).sum()]).tolist()  # exact counts
    return {"zero_frac": zeros / z.numel(), "dead_frac": dead / z.shape[1]}
