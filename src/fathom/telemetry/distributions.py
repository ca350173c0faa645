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
    return _summary(t.detach().reshape(-1), quantiles)[0]


def activation_summary(
    h: torch.Tensor, quantiles: tuple[float, ...] = QUANTILES
) -> dict[str, float | None]:
    """:func:`entry_summary` and :func:`zero_fractions` of activations ``h`` ``(N, units)``,
    the exact zeros (``-0.0 == 0.0``) counted once for both on the CPU. The same values as the
    two functions apart."""
    flat = h.detach().reshape(-1)
    summary, zeros = _summary(flat, quantiles)
    if h.numel() == 0:
        return {**summary, "zero_frac": None, "dead_frac": None}
    if zeros is None:
        return {**summary, **zero_fractions(h)}
    rows = h.detach().reshape(h.shape[0], -1).numpy(force=True)
    live = int(np.count_nonzero((rows != 0).any(axis=0)))  # NaN != 0: not dead
    return {
        **summary,
        "zero_frac": zeros / rows.size,
        "dead_frac": (rows.shape[1] - live) / rows.shape[1],
    }


def _summary(flat: torch.Tensor, quantiles: tuple[float, ...]) -> tuple[dict, int | None]:
    """:func:`entry_summary` of the 1-D ``flat``, and its number of exact zeros where the CPU
    route counted them on the way (``None`` otherwise)."""
    keys = ["mean", "std", "rms", "absmax", *(quantile_key(q) for q in quantiles)]
    if flat.numel() == 0:
        return dict.fromkeys(keys), None
    x = flat.to(torch.float64)
    head = [x.mean().item(), x.std(correction=0).item(), x.square().mean().sqrt().item()]
    n = flat.numel()
    pos = [q * (n - 1) for q in quantiles]
    ranks = _quantile_ranks(n, quantiles)
    picked, zeros = _order_statistics(flat, ranks)
    order = dict(zip(ranks, picked, strict=True))
    lo, hi = order[0], order[n - 1]
    absmax = hi if math.isnan(hi) else max(abs(lo), abs(hi))  # max |x| (NaN sorts last)
    # Q(q) in Python floats: IEEE float64, the same operations in the same order as the
    # tensor formula (tests/test_telemetry.py compares the two bit for bit)
    qs = [
        order[math.floor(p)] + (p - math.floor(p)) * (order[math.ceil(p)] - order[math.floor(p)])
        for p in pos
    ]
    return dict(zip(keys, [*head, absmax, *qs], strict=True)), zeros


def _quantile_ranks(n: int, quantiles: tuple[float, ...]) -> list[int]:
    """The ascending 0-based ranks the summary of ``n`` entries reads: the minimum, the maximum,
    and ``floor(p)``, ``ceil(p)`` of each ``p = q (n - 1)`` (:func:`entry_summary`)."""
    pos = [q * (n - 1) for q in quantiles]
    return sorted({0, n - 1, *(math.floor(p) for p in pos), *(math.ceil(p) for p in pos)})


def _order_statistics(flat: torch.Tensor, ranks: list[int]) -> tuple[list[float], int | None]:
    """``x_(r)`` for each ``r`` in the ascending ``ranks`` (0-based ranks of the ascending order,
    NaN last), as Python floats, and the number of exact zeros where it was counted.

    Float32 on the CPU with at least :data:`_SELECT_MIN` entries and no NaN goes by
    :func:`_select` (no full sort); everything else sorts (:func:`_ascending`).
    """
    if flat.device.type == "cpu" and flat.dtype == torch.float32 and flat.numel() >= _SELECT_MIN:
        a = flat.numpy(force=True)
        if not np.isnan(a.max()):  # (NaN propagates through max)
            selected = _select(a, ranks)
            if selected is not None:
                return selected
    xs = _ascending(flat)
    if isinstance(xs, np.ndarray):
        zero = np.zeros(1, dtype=xs.dtype)  # (typed: a Python float makes searchsorted slow)
        zeros = int(xs.searchsorted(zero, "right")[0]) - int(xs.searchsorted(zero, "left")[0])
        return xs[ranks].tolist(), zeros  # float32/64 -> Python float: exact, as torch's tolist
    return xs[torch.tensor(ranks, device=xs.device)].tolist(), None  # note: one host read


_SELECT_MIN = 8192
"""Below this many entries numpy's sort is about as fast as :func:`_select`
(``docs/benchmarks-history.md#observe-select-2026-12-06``)."""

_KEY_BITS = 12
""":func:`_select` counts the top 12 bits of a float32's key: 4096 bins, an eighth of an octave
each."""

_BINS = 1 << _KEY_BITS

_ZERO_BINS = (_BINS // 2 - 1, _BINS // 2)
"""The two bins of :func:`_select` holding ``-0.0`` and ``+0.0`` (with the float32 denormals
below ``2**-129`` in magnitude)."""


def _select(x: np.ndarray, ranks: list[int]) -> tuple[list[float], int] | None:
    """The order statistics of a float32 array without NaN, by one counting pass instead of a
    sort, and its number of exact zeros; ``None`` where nonzero values share a bin with the
    zeros (then the caller sorts).

    The bits ``i`` of a float32, read as int32, map to a key ``i ^ ((i >> 31) & 0x7fffffff)``
    whose integer order is the float order (``-0.0`` just below ``+0.0``). Its top 12 bits
    (sign, exponent, three mantissa bits: 4096 bins, each an eighth of an octave) are counted;
    the cumulative counts name the bin of each wanted rank, and only the entries of those bins
    are sorted. The exact zeros, counted apart, are the bins of ``-0.0`` and ``+0.0``
    (:data:`_ZERO_BINS`) whenever no other value falls there; a rank there is ``0.0``. The
    values equal those of the full sort (``-0.0`` and ``+0.0`` compare equal, and every
    quantile formula of :func:`_summary` gives ``+0.0`` from either).
    """
    n = x.size
    i = x.view(np.int32)
    key = i ^ ((i >> 31) & np.int32(0x7FFFFFFF))
    bins = (key >> (32 - _KEY_BITS)) + np.int32(_BINS // 2)  # in [0, _BINS)
    counts = np.bincount(bins, minlength=_BINS)
    zeros = n - int(np.count_nonzero(x))
    if int(counts[_ZERO_BINS[0]] + counts[_ZERO_BINS[1]]) != zeros:
        return None
    cum = np.cumsum(counts)
    r = np.asarray(ranks, dtype=np.int64)
    at = np.searchsorted(cum, r, side="right")  # the bin of each rank
    in_zero = (at == _ZERO_BINS[0]) | (at == _ZERO_BINS[1])
    wanted = np.zeros(_BINS, dtype=bool)
    wanted[at[~in_zero]] = True
    chosen = x[np.take(wanted, bins)]
    chosen.sort()
    kept = np.where(wanted, counts, 0)
    # a rank's place among the chosen entries: the chosen entries of earlier bins, then its
    # offset inside its own bin
    place = (np.cumsum(kept) - kept)[at] + (r - (cum - counts)[at])
    values = chosen[np.where(in_zero, 0, place)] if chosen.size else np.zeros_like(r, np.float32)
    return np.where(in_zero, np.float32(0.0), values).tolist(), zeros


def ascending(x: torch.Tensor) -> torch.Tensor:
    """The entries of a 1-D tensor in ascending order (NaN last), in its own dtype.

    Order statistics do not depend on the dtype they are sorted in (float16/32 -> float64 is
    exact and monotone), so the float64 quantiles of the sorted entries equal those of the
    sorted float64 entries bit for bit. On the CPU numpy's sort (vectorized where the CPU
    allows) is used: about 30x faster than ``torch.sort`` on 10^5 floats on an Intel Xeon, 4x
    on 32,000 on an AMD EPYC (Zen 4), where numpy's AVX-512 sort is slower.
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
