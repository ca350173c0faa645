"""Student's t, the normal and the beta by ``scipy.special``, bit for bit ``scipy.stats``.

``fathom.stats.inference`` and ``fathom.stats.intervals`` evaluate ``t.sf``, ``t.ppf``,
``norm.sf`` and ``norm.ppf`` through the special functions scipy.stats' distributions call
(``stdtr``, ``stdtrit``, ``ndtr``, ``ndtri``), and ``fathom.stats.chance`` the Clopper-Pearson
bounds ``beta.ppf`` by ``betaincinv``, skipping a distribution object per call and the import
of scipy.stats. Every verdict and interval depends on these numbers, so they are
checked equal, bit for bit, to scipy.stats' own on generated arguments (degrees of freedom
from 1 to 10^6, any float including ±0, ±inf and NaN; probabilities in (0, 1]), and the two
formulas built on them against the same formulas written with scipy.stats.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from scipy.special import ndtr, ndtri, stdtr, stdtrit
from scipy.stats import beta, norm, t

from fathom.errors import FathomError
from fathom.stats.chance import clopper_pearson
from fathom.stats.inference import _claim_p, interval
from fathom.stats.intervals import _t_critical
from fathom.stats.rules import Rules

_dof = st.one_of(st.integers(1, 40), st.integers(1, 10**6))
_x = st.floats(allow_nan=True, allow_infinity=True)
_q = st.one_of(
    st.floats(0.0, 1.0, exclude_min=True), st.sampled_from([1.0, 0.5, 0.975, 0.995, 5e-324])
)


def _same(a: float, b: float) -> bool:
    """Equal bit for bit (NaN equal to NaN; the sign of zero counts)."""
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@settings(max_examples=300, deadline=None)
@given(dof=_dof, x=_x, q=_q)
def test_special_functions_are_scipy_stats_values(dof, x, q) -> None:
    assert _same(stdtr(dof, -x), t.sf(x, dof))
    assert _same(ndtr(-x), norm.sf(x))
    assert _same(stdtrit(dof, q), t.ppf(q, dof))
    assert _same(ndtri(q), norm.ppf(q))


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 10**5),
    k=st.integers(0, 10**5),
    level=st.one_of(st.floats(0.01, 0.999), st.sampled_from([0.9, 0.95, 0.99])),
)
def test_clopper_pearson_bounds_are_scipy_stats_beta_quantiles(n, k, level) -> None:
    k = min(k, n)
    a = (1.0 - level) / 2.0
    low, high = clopper_pearson(k, n, level)
    assert _same(low, 0.0 if k == 0 else beta.ppf(a, k, n - k + 1))
    assert _same(high, 1.0 if k == n else beta.ppf(1.0 - a, k + 1, n - k))


def test_the_zero_quantile_differs_and_is_never_asked() -> None:
    """Found by the test above: ``stdtrit(d, 0)`` is ``+inf`` where ``t.ppf(0, d)`` is
    ``-inf`` (scipy.stats answers the support's edge itself). Fathom only asks for
    ``q = (1 + level) / 2`` with ``level`` in ``(0, 1)``, refused elsewhere, so ``q > 1/2``."""
    assert stdtrit(1, 0.0) == math.inf and t.ppf(0.0, 1) == -math.inf
    for level in (0.0, 1.0, -0.5):
        with pytest.raises(FathomError, match="outside"):
            _t_critical(level, 3)
        with pytest.raises(ValidationError):
            Rules(level=level)


_pos = st.floats(0.0, 1e3)


@settings(max_examples=200, deadline=None)
@given(
    mean=st.floats(-1e3, 1e3),
    se_t=_pos,
    floor=_pos,
    n=st.integers(2, 50),
    level=st.sampled_from([0.8, 0.9, 0.95, 0.99]),
    delta=st.floats(0.0, 10.0),
)
def test_intervals_and_claim_p_values_equal_the_scipy_stats_formulas(
    mean, se_t, floor, n, level, delta
) -> None:
    q = (1.0 + level) / 2.0
    half = max(float(t.ppf(q, n - 1)) * se_t, float(norm.ppf(q)) * floor)
    assert interval(mean, se_t, floor, n, level) == (mean - half, mean + half)
    assert _t_critical(level, n - 1) == float(t.ppf(q, n - 1))

    def sf(x: float, scale: float, dist) -> float:
        return (0.0 if x > 0 else 1.0) if scale <= 0.0 else 2.0 * float(dist.sf(x / scale))

    def p_of(x: float) -> float:
        return max(sf(x, se_t, t(n - 1)), sf(x, floor, norm))

    want = min(1.0, p_of(mean - delta), p_of(-delta - mean), p_of(min(mean + delta, delta - mean)))
    assert _claim_p(mean, se_t, floor, n, delta) == want
