"""The order statistics behind every quantile field: the counting route (:func:`_select`, no full
sort) against ``torch.sort`` of the float64 entries, and the summaries built on it bit for bit.

Counter-examples found while building it are kept as named tests below the properties.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fathom.telemetry import distributions
from fathom.telemetry.distributions import (
    _SELECT_MIN,
    _select,
    activation_summary,
    entry_summary,
    zero_fractions,
)
from fathom.telemetry.field import QUANTILES, quantile_key

_SPECIAL = np.array(
    [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1e-45, -1e-45, 1e-38, 3.4e38, -3.4e38],
    dtype=np.float32,
)


def _entries(seed: int, n: int, zero_frac: float, special_frac: float, scale: float) -> np.ndarray:
    """``n`` float32 entries: normal draws at ``scale``, a fraction set to exact zeros (as a
    ReLU's output), a fraction drawn from :data:`_SPECIAL`, and ties from rounding."""
    g = np.random.default_rng(seed)
    x = (g.standard_normal(n) * scale).astype(np.float32)
    x[g.random(n) < zero_frac] = 0.0
    special = g.random(n) < special_frac
    x[special] = g.choice(_SPECIAL, size=int(special.sum()))
    return x


def _reference(x: np.ndarray, ranks: list[int]) -> list[float]:
    """Independent: torch's sort of the float64 entries."""
    xs = torch.sort(torch.from_numpy(x).to(torch.float64)).values
    return xs[torch.tensor(ranks)].tolist()


def _ranks(n: int, data) -> list[int]:
    picked = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=16))
    return sorted({0, n - 1, *picked})


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 3000),
    zero_frac=st.sampled_from([0.0, 0.3, 0.9, 1.0]),
    special_frac=st.sampled_from([0.0, 0.01, 0.5]),
    scale=st.sampled_from([1e-40, 1e-3, 1.0, 1e30]),
    data=st.data(),
)
def test_select_equals_the_float64_sort_or_declines_only_for_values_beside_zero(
    seed, n, zero_frac, special_frac, scale, data
):
    """Every order statistic equals the float64 sort's (``-0.0 == 0.0``); the exact-zero count
    is that of ``x == 0``; it declines (``None``) only when a nonzero value shares a bin with
    the zeros (magnitude below ``2**-129``)."""
    x = _entries(seed, n, zero_frac, special_frac, scale)
    ranks = _ranks(n, data)
    got = _select(x, ranks)
    tiny = bool(np.any((x != 0) & (np.abs(x) < 2.0**-129)))
    if got is None:
        assert tiny
        return
    values, zeros = got
    assert values == _reference(x, ranks)
    assert zeros == int(np.sum(x == 0))
    assert all(isinstance(v, float) for v in values)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(_SELECT_MIN, 3 * _SELECT_MIN),
    zero_frac=st.sampled_from([0.0, 0.5, 0.999]),
    special_frac=st.sampled_from([0.0, 0.001]),
    scale=st.sampled_from([1e-3, 1.0, 1e30]),
    nan=st.booleans(),
)
def test_summaries_of_large_float32_tensors_equal_the_sorted_float64_formula_bit_for_bit(
    seed, n, zero_frac, special_frac, scale, nan
):
    """Above :data:`_SELECT_MIN` entries the summaries take the counting route; their quantile
    fields equal the interpolation formula on ``torch.sort`` of the float64 entries bit for bit,
    and the zero fractions equal :func:`zero_fractions`'s (NaN: the sort route, NaN last)."""
    x = _entries(seed, n, zero_frac, special_frac, scale)
    if nan:
        x[seed % n] = np.nan
    t = torch.from_numpy(x)
    xs = torch.sort(t.to(torch.float64)).values
    pos = torch.tensor(QUANTILES, dtype=torch.float64) * (n - 1)
    lo, hi = pos.floor().long(), pos.ceil().long()
    want = xs[lo] + (pos - lo.to(torch.float64)) * (xs[hi] - xs[lo])
    summary = entry_summary(t)
    got = torch.tensor([summary[quantile_key(q)] for q in QUANTILES], dtype=torch.float64)
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))
    absmax = float(t.to(torch.float64).abs().max())
    assert summary["absmax"] == absmax or (math.isnan(absmax) and math.isnan(summary["absmax"]))
    h = t[: (n // 64) * 64].reshape(64, -1)
    act = activation_summary(h)
    assert {k: act[k] for k in ("zero_frac", "dead_frac")} == zero_fractions(h)


def test_select_is_the_route_taken_above_its_threshold(monkeypatch):
    """The property above exercises the counting route, not the sort behind it."""
    calls = []
    monkeypatch.setattr(
        distributions, "_select", lambda x, r: calls.append(x.size) or _select(x, r)
    )
    entry_summary(torch.randn(_SELECT_MIN))
    entry_summary(torch.randn(_SELECT_MIN - 1))
    entry_summary(torch.randn(_SELECT_MIN, dtype=torch.float64))
    assert calls == [_SELECT_MIN]


def test_all_zeros_give_zero_everywhere_and_choose_no_bin():
    x = np.zeros(10_000, dtype=np.float32)
    x[::3] = -0.0
    values, zeros = _select(x, [0, 5000, 9999])
    assert [math.copysign(1.0, v) for v in values] == [1.0, 1.0, 1.0]
    assert values == [0.0, 0.0, 0.0] and zeros == 10_000


def test_a_denormal_beside_the_zeros_declines_and_the_sort_gives_it():
    x = np.zeros(10_000, dtype=np.float32)
    x[7] = 1e-45
    assert _select(x, [0, 9999]) is None
    assert entry_summary(torch.from_numpy(x))["absmax"] == float(np.float32(1e-45))


def test_a_quantile_between_minus_zero_and_plus_zero_is_plus_zero():
    """``-0.0`` and ``+0.0`` sort in either order; the interpolation gives ``+0.0`` from both."""
    x = np.ones(_SELECT_MIN, dtype=np.float32)
    x[: _SELECT_MIN // 2] = -0.0
    x[_SELECT_MIN // 2 : (3 * _SELECT_MIN) // 4] = 0.0
    s = entry_summary(torch.from_numpy(x))
    q50 = s[quantile_key(0.5)]
    assert q50 == 0.0 and math.copysign(1.0, q50) == 1.0


def test_one_bin_holding_every_value_sorts_that_bin():
    x = np.full(_SELECT_MIN, 1.0, dtype=np.float32)
    x[::2] = np.float32(1.0 + 2**-20)  # same bin (top 12 bits equal)
    ranks = [0, _SELECT_MIN // 2 - 1, _SELECT_MIN // 2, _SELECT_MIN - 1]
    assert _select(x, ranks)[0] == _reference(x, ranks)


@pytest.mark.parametrize("bad", [np.inf, -np.inf])
def test_infinities_are_the_extreme_ranks(bad):
    x = np.random.default_rng(0).standard_normal(_SELECT_MIN).astype(np.float32)
    x[11] = bad
    values, _ = _select(x, [0, _SELECT_MIN - 1])
    assert values == _reference(x, [0, _SELECT_MIN - 1]) and bad in values


def test_a_strided_view_is_read_in_its_own_order():
    """A 1-D view with a stride (every other entry, a column) is summarized as its entries."""
    base = torch.randn(4 * _SELECT_MIN, generator=torch.Generator().manual_seed(3))
    for view in (base[::2], base.reshape(-1, 4).t()[1]):
        assert not view.is_contiguous() and view.numel() >= _SELECT_MIN
        n = view.numel()
        ranks = [0, n // 3, n // 2, n - 1]
        assert _select(view.numpy(), ranks)[0] == _reference(view.numpy(), ranks)
        assert entry_summary(view) == entry_summary(view.contiguous())
