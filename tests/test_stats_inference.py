"""The inference engine: chance states, the comparison rule, Holm and leave-one-seed-out,
each against a brute-force float64 reference, and properties over generated data."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from fathom.stats.chance import chance_test, clopper_pearson
from fathom.stats.inference import judge, paired, verdict_of
from fathom.stats.quantities import accuracy, accuracy_variance_pp, cross_entropy, ratio
from fathom.stats.rules import Rules
from fathom.stats.sentences import comparison_sentence
from fathom.stats.verdicts import OPPOSITE

ACC = accuracy()


def _binom_cdf(k: int, n: int, p: float) -> float:
    """Brute-force binomial CDF in exact rationals, then float."""
    pf = Fraction(p)
    return float(sum(math.comb(n, i) * pf**i * (1 - pf) ** (n - i) for i in range(k + 1)))


@pytest.mark.parametrize(("k", "n"), [(0, 20), (3, 20), (10, 20), (20, 20), (37, 50)])
def test_clopper_pearson_against_the_binomial_tails(k, n):
    low, high = clopper_pearson(k, n, 0.95)
    # the defining equations: P(X >= k | low) = 0.025 and P(X <= k | high) = 0.025
    if k > 0:
        assert 1 - _binom_cdf(k - 1, n, low) == pytest.approx(0.025, abs=1e-9)
    else:
        assert low == 0.0
    if k < n:
        assert _binom_cdf(k, n, high) == pytest.approx(0.025, abs=1e-9)
    else:
        assert high == 1.0


@pytest.mark.parametrize(
    ("acc", "n", "classes", "state"),
    [
        pytest.param(0.999, 1000, 2, "trained", id="2-class-99.9"),
        pytest.param(0.60, 300, 3, "trained", id="3-class-60"),
        pytest.param(0.010, 10_000, 100, "failed", id="log-1pct"),
        pytest.param(0.0199, 10_000, 100, "undetermined", id="hair-below-old-cut"),
        pytest.param(0.0201, 10_000, 100, "undetermined", id="hair-above-old-cut"),
        pytest.param(0.005, 10_000, 100, "failed", id="below-chance"),
        pytest.param(math.nan, 10_000, 10, "failed", id="diverged"),
    ],
)
def test_chance_states(acc, n, classes, state):
    assert chance_test(acc, n_eval=n, classes=classes).state == state


@settings(max_examples=200)
@given(
    k=st.integers(0, 400),
    n_extra=st.integers(0, 400),
    classes=st.integers(2, 100),
    margin=st.floats(0.0, 0.2),
)
def test_chance_state_follows_its_definition(k, n_extra, classes, margin):
    n = k + n_extra + 1
    rules = Rules(chance_margin=margin)
    t = chance_test(k / n, n_eval=n, classes=classes, rules=rules)
    low, _ = clopper_pearson(k, n, rules.chance_level)
    p0 = 1 / classes
    expected = (
        "failed" if low <= p0 else "trained" if low > p0 + margin * (1 - p0) else "undetermined"
    )
    assert t.state == expected
    # monotone: one more correct answer never turns trained into failed
    if k + 1 <= n:
        up = chance_test((k + 1) / n, n_eval=n, classes=classes, rules=rules).state
        assert not (t.state == "trained" and up != "trained")


def _reference_interval(d, v, level):
    """Brute force: mean ± max(t·sd/√n, z·√Σv/n)."""
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    q = (1 + level) / 2
    half = max(
        scipy_stats.t.ppf(q, n - 1) * sd / math.sqrt(n),
        scipy_stats.norm.ppf(q) * math.sqrt(sum(v)) / n,
    )
    return mean - half, mean + half


def test_single_comparison_against_brute_force():
    a, b = {1: 93.0, 2: 93.4, 3: 93.2}, {1: 91.0, 2: 91.2, 3: 91.1}
    u = {s: accuracy_variance_pp(5000) for s in a}
    (c,) = judge("f", [paired("x", ACC, a, b, names=("c", "r"), var_a=u, var_b=u)])
    d = [a[s] - b[s] for s in a]
    lo, hi = _reference_interval(d, [2 * u[1]] * 3, 0.95)
    assert (c.low, c.high) == pytest.approx((lo, hi), abs=1e-12)
    assert c.verdict == verdict_of(lo, hi, 0.5, True) == "better"
    assert c.level == 0.95 and c.family_size == 1


def test_identical_per_seed_differences_never_give_a_point_interval():
    # once printed "[+0.1000, +0.1000]": identical differences of 0.1 pp
    a, b = {1: 90.1, 2: 90.1, 3: 90.1}, {1: 90.0, 2: 90.0, 3: 90.0}
    u = {s: accuracy_variance_pp(10_000) for s in a}
    (c,) = judge("f", [paired("x", ACC, a, b, names=("c", "r"), var_a=u, var_b=u)])
    assert c.high - c.low > 0.5  # at least 2 z · √(2·0.25)/3 pp
    assert c.verdict == "not established"
    # without a known test-set size the printed resolution still floors it
    (c,) = judge("f", [paired("x", ACC, a, b, names=("c", "r"))])
    assert c.high - c.low > 0 and c.verdict == "equivalent"


def test_tenth_of_a_point_from_two_seeds_is_not_better():
    (c,) = judge("f", [paired("x", ACC, {1: 80.1, 2: 80.12}, {1: 80.0, 2: 80.0}, names=("a", "b"))])
    assert c.verdict != "better"


def test_n1_and_bad_input_are_never_verdicts():
    (c,) = judge("f", [paired("x", ACC, {1: 95.0}, {1: 90.0}, names=("a", "b"))])
    assert c.verdict == "not established" and c.low is None
    bad = [
        paired("u", ACC, {1: 1.0, 2: 2.0}, {1: 1.0}, names=("a", "b")),
        paired("n", ACC, {1: math.nan, 2: 2.0}, {1: 1.0, 2: 1.0}, names=("a", "b")),
        paired("e", ACC, {}, {}, names=("a", "b")),
    ]
    out = {c.id: c for c in judge("f", bad)}
    assert all(c.verdict == "no comparison" for c in out.values())
    assert "unequal seeds" in out["u"].reason and "[2] only in a" in out["u"].reason
    assert "no finite value at seed(s) [1]" in out["n"].reason
    assert "no seed" in out["e"].reason


def _holm_reference(items, level):
    """Holm step-down by brute force: levels 1 − α/(m − k + 1) in p order until one fails."""
    alpha = 1 - level
    cs = judge("ref", items)  # only for the p ordering key
    order = sorted(cs, key=lambda c: (c.p_claim, c.id))
    m, out, stop = len(order), {}, None
    for k, c in enumerate(order, start=1):
        lev = stop if stop is not None else 1 - alpha / (m - k + 1)
        d = c.diffs
        lo, hi = _reference_interval(d, c.variances, lev)
        out[c.id] = verdict_of(lo, hi, c.quantity.smallest_effect, c.quantity.higher_is_better)
        if stop is None and out[c.id] == "not established":
            stop = lev
    return out


diffs = st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=6)


@settings(max_examples=60)
@given(st.lists(diffs, min_size=1, max_size=6))
def test_holm_family_matches_brute_force(families):
    items = [
        paired(
            f"c{i}",
            ACC,
            {s: 90 + x for s, x in enumerate(d)},
            {s: 90.0 for s in range(len(d))},
            names=("a", "b"),
        )
        for i, d in enumerate(families)
    ]
    got = {c.id: c.verdict for c in judge("f", items)}
    assert got == _holm_reference(items, 0.95)
    # a family never establishes more than its members would alone
    for item in items:
        (alone,) = judge("g", [item])
        if alone.verdict == "not established":
            assert got[item.id] == "not established"


@settings(max_examples=150)
@given(diffs, st.floats(-3, 3), st.sampled_from([ACC, cross_entropy(), ratio("norm")]))
@example([0.1, 0.1, 0.1], 0.0, ACC)
def test_properties_of_one_comparison(d, shift, q):
    seeds = range(len(d))
    a = {s: 10 + x + shift for s, x in zip(seeds, d)}
    b = {s: 10.0 + shift for s in seeds}
    (c,) = judge("f", [paired("x", q, a, b, names=("a", "b"))])
    (m,) = judge("f", [paired("x", q, b, a, names=("b", "a"))])
    (c0,) = judge(
        "f",
        [
            paired(
                "x",
                q,
                {s: 10 + x for s, x in zip(seeds, d)},
                {s: 10.0 for s in seeds},
                names=("a", "b"),
            )
        ],
    )
    # swapping arms mirrors; a common shift changes nothing
    assert m.verdict == OPPOSITE.get(c.verdict, c.verdict)
    assert c0.verdict == c.verdict
    # never better when no better on every seed (and symmetrically)
    if all(x <= 0 for x in d):
        assert c.verdict != "higher" and c.verdict != direction(q, +1)
    if all(x >= 0 for x in d):
        assert c.verdict != direction(q, -1)
    # improving a never turns a "higher" verdict into a "lower" one
    (up,) = judge("f", [paired("x", q, {s: v + 1.0 for s, v in a.items()}, b, names=("a", "b"))])
    assert not (c.verdict == direction(q, +1) and up.verdict == direction(q, -1))
    # the interval is never a point, and the verdict reads it
    assert c.high > c.low
    assert c.verdict == verdict_of(c.low, c.high, q.smallest_effect, q.higher_is_better)


def direction(q, sign):
    from fathom.stats.inference import direction_word

    return direction_word(sign, q.higher_is_better)


def _loo_reference(d, level, delta):
    """Brute force: the verdict on every n − 1 subset, and the estimates."""
    out = []
    for s in d:
        rest = [v for k, v in d.items() if k != s]
        lo, hi = (
            _reference_interval(rest, [1e-4] * len(rest), level) if len(rest) > 1 else (None, None)
        )
        out.append((sum(rest) / len(rest), verdict_of(lo, hi, delta, True)))
    return out


@settings(max_examples=80)
@given(st.lists(st.floats(-4, 8, allow_nan=False), min_size=3, max_size=6))
@example([2.0, 2.1, 2.2])
def test_leave_one_seed_out_against_brute_force(xs):
    d = dict(enumerate(xs))
    (c,) = judge(
        "f",
        [
            paired(
                "x", ACC, {s: 90 + x for s, x in d.items()}, {s: 90.0 for s in d}, names=("a", "b")
            )
        ],
    )
    if c.verdict == "not established":
        assert c.loo_held is None and not c.fragile
        return
    ref = _loo_reference(d, c.level, ACC.smallest_effect)
    assert c.loo_estimates == pytest.approx([e for e, _ in ref])
    assert c.loo_held == sum(v == c.verdict for _, v in ref)
    # fragile: the verdict's own interval, recentred on some leave-one-out estimate, loses it
    lo, _ = _reference_interval(xs, [1e-4] * len(xs), c.level)
    half = sum(xs) / len(xs) - lo
    carried = any(verdict_of(e - half, e + half, 0.5, True) != c.verdict for e, _ in ref)
    assert c.fragile == carried


def _one_seed_carries(n, e, eta):
    """``d = (a, …, a, a + e)`` with ``a`` set so that ``low − δ = η · e/n``: one seed (the
    last) pulls the mean by ``e/n``, the margin is ``η`` times that (t dominates the floor)."""
    t = scipy_stats.t.ppf(0.975, n - 1)
    a = ACC.smallest_effect + (t - 1 + eta) * e / n
    d = [a] * (n - 1) + [a + e]
    (c,) = judge(
        "f", [paired("x", ACC, dict(enumerate(d)), dict.fromkeys(range(n), 0.0), names=("a", "b"))]
    )
    return c


@settings(max_examples=60)
@given(st.integers(3, 8), st.floats(1.0, 20.0), st.floats(0.05, 0.9))
@example(3, 2.0, 0.5)
def test_fragile_fires_when_one_seed_carries_the_margin(n, e, eta):
    c = _one_seed_carries(n, e, eta)
    assert c.verdict == "better" and c.fragile
    assert c.low - ACC.smallest_effect == pytest.approx(eta * e / n)
    assert "better, fragile" in comparison_sentence(c).text


@settings(max_examples=60)
@given(st.integers(3, 8), st.floats(1.0, 20.0), st.floats(1.1, 4.0))
def test_fragile_does_not_fire_when_the_margin_exceeds_every_seeds_pull(n, e, eta):
    c = _one_seed_carries(n, e, eta)
    assert c.verdict == "better" and not c.fragile


@settings(max_examples=80)
@given(
    st.floats(-10.0, 10.0),
    st.lists(st.floats(0.0, 0.3, allow_nan=False), min_size=3, max_size=7),
)
@example(2.0, [0.0, 0.0, 0.0])  # identical differences: the floor's interval, never fragile
def test_fragile_never_fires_when_every_seed_alone_clears_the_region(base, spread):
    d = {s: base + x for s, x in enumerate(spread)}
    (c,) = judge("f", [paired("x", ACC, d, dict.fromkeys(d, 0.0), names=("a", "b"))])
    if c.verdict in ("better", "worse"):
        half = (c.high - c.low) / 2
        sign = 1 if c.verdict == "better" else -1
        # every seed's own difference (hence every leave-one-out mean) clears δ by half
        if min(sign * x for x in d.values()) - half > ACC.smallest_effect:
            assert not c.fragile
    elif c.verdict == "equivalent" and all(
        abs(x) + (c.high - c.low) / 2 < ACC.smallest_effect for x in d.values()
    ):
        assert not c.fragile


def test_leave_one_out_flags_a_reversal():
    """On a verdict the interval would not give: a leave-one-out estimate reverses."""
    from fathom.stats.inference import leave_one_out

    p = paired("x", ACC, {1: 99.0, 2: 89.0, 3: 89.5}, {1: 90.0, 2: 90.0, 3: 90.0}, names=("a", "b"))
    fragile, est, held = leave_one_out(p, "better", 0.95)
    assert fragile and min(est) < 0 and held == 0
    p = paired("x", ACC, {1: 95.0, 2: 95.2, 3: 95.1}, {1: 90.0, 2: 90.0, 3: 90.0}, names=("a", "b"))
    assert leave_one_out(p, "better", 0.95)[0] is False
