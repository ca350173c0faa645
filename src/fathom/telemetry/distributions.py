"""Summaries of a tensor's entries: moments, exact-zero fractions, quantiles.

All reductions are over every entry (examples x units) and run in float64.
"""

from __future__ import annotations

import math
from typing import Any

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
    return _summary(t.detach().reshape(-1), quantiles)[0]


def activation_summary(
    h: torch.Tensor, quantiles: tuple[float, ...] = QUANTILES
) -> dict[str, float | None]:
    """:func:`entry_summary` and :func:`zero_fractions` of activations ``h`` ``(N, units)``
    in one pass over the sorted entries: the exact zeros are one run of the ascending order
    (``-0.0 == 0.0``; NaN sorts last), counted there instead of by a comparison over every
    entry. The same values as the two functions apart."""
    flat = h.detach().reshape(-1)
    summary, xs = _summary(flat, quantiles)
    if h.numel() == 0:
        return {**summary, "zero_frac": None, "dead_frac": None}
    if not isinstance(xs, np.ndarray):
        return {**summary, **zero_fractions(h)}
    zero = np.zeros(1, dtype=xs.dtype)  # (typed: a Python float makes searchsorted slow)
    zeros = int(xs.searchsorted(zero, "right")[0]) - int(xs.searchsorted(zero, "left")[0])
    rows = h.detach().reshape(h.shape[0], -1).numpy(force=True)
    live = int(np.count_nonzero((rows != 0).any(axis=0)))  # NaN != 0: not dead
    return {
        **summary,
        "zero_frac": zeros / rows.size,
        "dead_frac": (rows.shape[1] - live) / rows.shape[1],
    }


def _summary(flat: torch.Tensor, quantiles: tuple[float, ...]) -> tuple[dict, Any]:
    """:func:`entry_summary` of the 1-D ``flat``, and its entries in ascending order (a numpy
    array on the CPU, see :func:`ascending`; ``None`` when empty)."""
    keys = ["mean", "std", "rms", "absmax", *(quantile_key(q) for q in quantiles)]
    if flat.numel() == 0:
        return dict.fromkeys(keys), None
    x = flat.to(torch.float64)
    head = [x.mean().item(), x.std(correction=0).item(), x.square().mean().sqrt().item()]
    xs = _ascending(flat)
    n = int(xs.shape[0])
    pos = [q * (n - 1) for q in quantiles]
    ranks = sorted({0, n - 1, *(math.floor(p) for p in pos), *(math.ceil(p) for p in pos)})
    if isinstance(xs, np.ndarray):
        picked = xs[ranks].tolist()  # float32/64 -> Python float: exact, as torch's tolist
    else:
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
    return dict(zip(keys, [*head, absmax, *qs], strict=True)), xs


def ascending(x: torch.Tensor) -> torch.Tensor:
    """The entries of a 1-D tensor in ascending order (NaN last), in its own dtype.

    Order statistics do not depend on the dtype they are sorted in (float16/32 -> float64 is
    exact and monotone), so the float64 quantiles of the sorted entries equal those of the
    sorted float64 entries bit for bit. On the CPU numpy's sort (vectorized where the CPU
    allows) is used: about 30x faster than ``torch.sort`` on 10^5 floats.
    """
    xs = _ascending(x)
    return torch.from_numpy(xs) if isinstance(xs, np.ndarray) else xs


def _ascending(x: torch.Tensor) -> np.ndarray | torch.Tensor:
    """:func:`ascending`, as the numpy array itself on the CPU (no tensor wrapper)."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return np.sort(x.numpy(force=True))
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
