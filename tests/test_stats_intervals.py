"""Seed intervals against scipy.stats and failure flags on hand-made runs."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fathom.errors import FathomError
from fathom.stats.flags import (
    CHANCE_CE_TOLERANCE,
    NOT_FITTING_ACCURACY,
    failure_flags,
    is_excluded,
)
from fathom.stats.intervals import Interval, mean_sd, paired_difference, t_interval

SAMPLES = [
    pytest.param([0.981, 0.975, 0.979], id="three-seeds"),
    pytest.param([1.0, 2.0], id="two-seeds"),
    pytest.param([0.1, -0.3, 0.25, 0.05, 0.0, 0.7], id="six-mixed-sign"),
]


@pytest.mark.parametrize("values", SAMPLES)
@pytest.mark.parametrize("level", [0.95, 0.9])
def test_t_interval_matches_scipy(values, level):
    x = np.asarray(values, dtype=np.float64)
    ref_low, ref_high = stats.t.interval(level, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    got = t_interval(values, level)
    assert got.n == len(x)
    assert got.method == "t"
    assert got.estimate == pytest.approx(x.mean(), abs=1e-15)
    assert got.low == pytest.approx(ref_low, rel=1e-12)
    assert got.high == pytest.approx(ref_high, rel=1e-12)


@pytest.mark.parametrize("values", SAMPLES)
def test_mean_sd_is_sample_sd(values):
    mean, sd, n = mean_sd(values)
    assert n == len(values)
    assert mean == pytest.approx(np.mean(values))
    assert sd == pytest.approx(np.std(values, ddof=1), rel=1e-12)


def test_paired_difference_matches_scipy_ttest_rel():
    a = {101: 0.981, 102: 0.975, 103: 0.979, 104: 0.5}
    b = {101: 0.978, 102: 0.977, 103: 0.970, 200: 0.1}
    got = paired_difference(a, b)
    common = [101, 102, 103]
    xa = np.array([a[s] for s in common])
    xb = np.array([b[s] for s in common])
    ref = stats.ttest_rel(xa, xb).confidence_interval(0.95)
    assert got.n == 3
    assert got.method == "paired t"
    assert got.estimate == pytest.approx((xa - xb).mean())
    assert got.low == pytest.approx(ref.low, rel=1e-10)
    assert got.high == pytest.approx(ref.high, rel=1e-10)


def test_n_one_gives_no_interval():
    got = t_interval([0.42])
    assert got == Interval(0.42, None, None, 1, 0.95, "t")
    assert not got.has_interval
    assert mean_sd([0.42]) == (0.42, None, 1)
    assert mean_sd([]) == (None, None, 0)
    assert paired_difference({1: 0.5}, {1: 0.25}).low is None


def test_bad_interval_input_is_refused():
    with pytest.raises(FathomError, match="at least one seed"):
        t_interval([])
    with pytest.raises(FathomError, match="not a finite number"):
        t_interval([0.5, math.nan])
    with pytest.raises(FathomError, match="not a finite number"):
        mean_sd([0.5, None])
    with pytest.raises(FathomError, match="outside"):
        t_interval([0.1, 0.2], level=95)
    with pytest.raises(FathomError, match="no common seeds"):
        paired_difference({1: 0.1}, {2: 0.2})


def _flags(**kw):
    return failure_flags(**{"train_ce": None, "n_eval": 10_000, **kw})


def test_flags_diverged_from_status_or_non_finite():
    assert _flags(status="diverged", test_acc=None, classes=10) == ["diverged"]
    assert _flags(status="complete", test_acc=0.9, train_ce=math.inf, classes=10) == ["diverged"]


def test_flags_at_chance_by_the_binomial_interval_not_a_cut():
    # the log's regularized arm at 1.0% on 10,000 CIFAR-100 examples: at chance
    assert _flags(status="complete", test_acc=0.010, classes=100) == ["at_chance"]
    # 2% (the old 2/C cut) is above chance but not clearly: undetermined, excluded
    assert _flags(status="complete", test_acc=0.020, classes=100) == ["near_chance"]
    assert _flags(status="complete", test_acc=0.037, classes=100) == []
    # a 2-class run at 99.9% and a 3-class run at 60% are trained (the old rule flagged them)
    assert _flags(status="complete", test_acc=0.999, classes=2) == []
    assert _flags(status="complete", test_acc=0.60, classes=3, n_eval=300) == []


def test_ce_near_ln_c_is_a_caveat_not_a_failure():
    ln10 = math.log(10)
    just_above = (1 - CHANCE_CE_TOLERANCE) * ln10 + 1e-9
    just_below = (1 - CHANCE_CE_TOLERANCE) * ln10 - 1e-3
    flags = _flags(status="complete", test_acc=0.9, train_ce=just_above, classes=10)
    assert flags == ["ce_near_chance"] and not is_excluded(flags)
    assert _flags(status="complete", test_acc=0.9, train_ce=just_below, classes=10) == []


def test_an_accuracy_without_its_test_set_size_is_not_judged():
    flags = _flags(status="complete", test_acc=0.9, classes=10, n_eval=None)
    assert flags == ["n_eval_unknown"] and is_excluded(flags)


def test_flags_not_fitting_and_incomplete():
    flags = _flags(
        status="complete",
        test_acc=0.3,
        train_ce=1.0,
        classes=10,
        fit_acc=NOT_FITTING_ACCURACY - 0.01,
    )
    assert flags == ["not_fitting"]
    assert not is_excluded(flags)
    flags = _flags(status="failed", test_acc=None, classes=10)
    assert flags == ["incomplete"]
    assert is_excluded(flags)


def test_flags_bad_input():
    with pytest.raises(FathomError, match="unknown run status"):
        _flags(status="done", test_acc=0.5, train_ce=1.0, classes=10)
    # one class: no chance level, an excluding flag, never an exception
    one = _flags(status="complete", test_acc=0.5, train_ce=1.0, classes=1)
    assert one == ["one_class"] and is_excluded(one)
    with pytest.raises(FathomError, match="at least one test example"):
        _flags(status="complete", test_acc=0.5, classes=10, n_eval=0)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 3000),
    frac=st.floats(0.0, 1.0),
    classes=st.integers(2, 200),
    level=st.sampled_from([0.9, 0.95, 0.99]),
)
def test_the_chance_state_is_the_clopper_pearson_rule_against_scipy(n, frac, classes, level):
    """The scipy-free state (binomial tails, exact in float64) against the interval's rule
    computed with scipy's Beta quantiles: ``low <= p0`` failed, ``low > p1`` trained."""
    from fathom.stats.chance import chance_and_boundary, chance_state, clopper_pearson
    from fathom.stats.rules import DEFAULT_RULES

    k = round(frac * n)
    p0, p1 = chance_and_boundary(classes, DEFAULT_RULES)
    low, _ = clopper_pearson(k, n, level)
    want = "failed" if low <= p0 else "trained" if low > p1 else "undetermined"
    assert chance_state(k, n, p0, p1, level) == want


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 400), k=st.integers(0, 400), p=st.floats(1e-4, 1 - 1e-4))
def test_the_binomial_upper_tail_against_scipy(n, k, p):
    """``P(X >= k)`` against scipy's survival function (float64 reference)."""
    from fathom.stats.chance import binomial_upper_tail

    want = float(stats.binom.sf(k - 1, n, p))
    assert binomial_upper_tail(k, n, p) == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_failure_flags_import_no_scipy():
    """A run's warnings after ``fathom train``'s last line cost no scipy import."""
    import subprocess
    import sys

    code = (
        "import sys; from fathom.stats.flags import failure_flags;"
        "failure_flags(status='complete', test_acc=0.5, train_ce=0.1, classes=10, n_eval=100);"
        "print('scipy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
