"""The tests and bad-input cases for the recipe comparisons of a study summary and
the telemetry contrasts (the depth-scaling tables: ``test_stats_scaling.py``).

Properties over generated tables — no better on every seed ⇒ never "better" (and
symmetrically); swapping the arms mirrors the verdict; adding the same constant to both arms
changes nothing; improving the candidate never turns "better" into "worse"; a cell in the
undetermined band never decides a verdict; every sentence passes the claim checker — and bad
input (missing seeds, unequal seeds per arm, NaN, one class, one seed): a "no comparison"
naming the reason, never an exception or a verdict.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.stats.chance import chance_test
from fathom.stats.claims import check
from fathom.stats.contrasts import contrast, contrast_sentence
from fathom.stats.results import Results
from fathom.stats.summary import RunRecord, summarise_study
from fathom.stats.verdicts import OPPOSITE

N_TEST = 2000
MIRROR = {**OPPOSITE, "equivalent": "equivalent", "not established": "not established"}


def _record(recipe, seed, sel, fin, *, classes=10, status="complete", n_test=N_TEST):
    return RunRecord(
        recipe=recipe,
        seed=seed,
        lr=0.01,
        status=status,
        classes=classes,
        selected={"test_acc": sel, "test_ce": 1.0, "val_ce": 0.1, "epoch": 2},
        final={"test_acc": fin, "test_ce": 1.0, "val_ce": 0.2, "epoch": 5},
        fit_acc_final=1.0,
        training_clock_s=1.0,
        elapsed_s=2.0,
        curve=[(1, 0.5, 1.0, 0.9)],
        fit_ce_final=0.01,
        n_test=n_test,
    )


def _verdicts(base, cand, *, classes=10, names=("base", "cand")):
    """Verdicts of cand vs base on test accuracy, ``{checkpoint: verdict}`` (``base`` and
    ``cand``: per seed ``(selected, final)`` accuracies); every sentence checked."""
    recs = [_record(names[0], s, *v, classes=classes) for s, v in base.items()]
    recs += [_record(names[1], s, *v, classes=classes) for s, v in cand.items()]
    s = summarise_study(recs, reference=names[0])
    assert check(Results(**s["results"])) == []
    return {c["checkpoint"]: c for c in s["comparisons"] if c["metric"] == "test_acc"}


SEEDS = (1, 2, 3)
acc = st.floats(0.3, 0.95, allow_nan=False)
arms = st.fixed_dictionaries({s: st.tuples(acc, acc) for s in SEEDS})
steps = st.fixed_dictionaries({s: st.tuples(st.floats(0, 0.04), st.floats(0, 0.04)) for s in SEEDS})


def _plus(arm, step, sign=1):
    """``arm`` moved by ``sign · step``, kept in [0, 1] (an accuracy above 1 is refused)."""
    return {
        s: tuple(min(1.0, max(0.0, x + sign * d)) for x, d in zip(arm[s], step[s])) for s in arm
    }


@settings(max_examples=15, deadline=None)
@given(arms, steps)
@example({s: (0.9, 0.9) for s in SEEDS}, {s: (0.0, 0.0) for s in SEEDS})  # equal arms
def test_recipe_comparison_no_better_on_every_seed_is_never_better(base, step):
    worse = _verdicts(base, _plus(base, step, -1))
    better = _verdicts(base, _plus(base, step, +1))
    assert all(c["verdict"] != "better" for c in worse.values())
    assert all(c["verdict"] != "worse" for c in better.values())


@settings(max_examples=15, deadline=None)
@given(arms, arms, st.floats(-0.04, 0.04))
def test_recipe_comparison_mirrors_under_swapped_arms_and_ignores_a_common_shift(b, c, shift):
    v = _verdicts(b, c)
    swapped = _verdicts(c, b, names=("cand", "base"))
    moved = _verdicts(
        _plus(b, {s: (shift, shift) for s in SEEDS}), _plus(c, {s: (shift, shift) for s in SEEDS})
    )
    for w in ("selected", "final"):
        assert swapped[w]["verdict"] == MIRROR[v[w]["verdict"]]
        assert moved[w]["verdict"] == v[w]["verdict"]


@settings(max_examples=15, deadline=None)
@given(arms, steps, steps)
@example(  # better may become not established (one seed's gain widens the spread), never worse
    {s: (0.9, 0.9) for s in SEEDS},
    {s: (0.03, 0.03) for s in SEEDS},
    {1: (0.0, 0.0), 2: (0.0, 0.0), 3: (0.04, 0.04)},
)
def test_improving_the_candidate_never_turns_better_into_worse(base, lead, step):
    cand = _plus(base, lead)
    v, up = _verdicts(base, cand), _verdicts(base, _plus(cand, step))
    for w in ("selected", "final"):
        assert not (v[w]["verdict"] == "better" and up[w]["verdict"] == "worse")


def test_a_gain_on_one_seed_can_unsettle_better_but_not_reverse_it():
    """The counter-example hypothesis found to the stronger claim "better stays better"."""
    base = {s: (0.9, 0.9) for s in SEEDS}
    cand = {s: (0.93, 0.93) for s in SEEDS}
    v = _verdicts(base, cand)
    up = _verdicts(base, {**cand, 3: (0.97, 0.97)})
    assert v["final"]["verdict"] == "better"
    assert up["final"]["verdict"] == "not established"


BAND = [
    k / N_TEST
    for k in range(N_TEST // 10, N_TEST // 10 + N_TEST // 20)
    if chance_test(k / N_TEST, n_eval=N_TEST, classes=10).state == "undetermined"
]


@settings(max_examples=10, deadline=None)
@given(arms, arms, st.sampled_from(SEEDS), st.sampled_from(BAND), st.sampled_from(BAND))
def test_a_recipe_verdict_never_depends_on_a_cell_in_the_undetermined_band(b, c, seed, x, y):
    out = []
    for value in (x, y):
        cand = {**c, seed: (c[seed][0], value)}  # final accuracy decides the flags
        out.append(_verdicts(b, cand))
    for w in ("selected", "final"):
        assert out[0][w]["verdict"] == out[1][w]["verdict"] == "no comparison"
        assert "cand excluded (near_chance)" in out[0][w]["reason"]


# ---- named tables, recipe comparisons ---------------------------------------------------


@pytest.mark.parametrize(
    ("classes", "accuracy"), [(2, 0.999), (3, 0.60)], ids=["2-class-99.9", "3-class-60"]
)
def test_far_above_chance_with_few_classes_is_compared_not_excluded(classes, accuracy):
    base = {s: (accuracy - 0.004 * s, accuracy - 0.004 * s) for s in SEEDS}
    cand = {s: (accuracy - 0.1 - 0.004 * s, accuracy - 0.1 - 0.004 * s) for s in SEEDS}
    v = _verdicts(base, cand, classes=classes)
    assert v["selected"]["verdict"] == v["final"]["verdict"] == "worse"


def test_identical_per_seed_differences_are_no_point_interval_in_a_summary():
    base = {s: (0.90 + 0.01 * s, 0.90 + 0.01 * s) for s in SEEDS}
    cand = {s: (0.901 + 0.01 * s, 0.901 + 0.01 * s) for s in SEEDS}  # +0.1 pp on every seed
    v = _verdicts(base, cand)["final"]
    assert v["diff"]["high"] - v["diff"]["low"] > 0.1
    assert v["verdict"] == "not established"


# ---- bad input: recipe comparisons --------------------------------------------------------


def _summary(recs):
    s = summarise_study(recs, reference="base")
    assert check(Results(**s["results"])) == []
    return {(c["recipe"], c["metric"], c["checkpoint"]): c for c in s["comparisons"]}


def _full(name, accs=(0.9, 0.91, 0.92), **kw):
    return [_record(name, s, a, a, **kw) for s, a in zip(SEEDS, accs)]


@pytest.mark.parametrize(
    ("recs", "reason"),
    [
        (_full("base") + _full("cand")[:2], "unequal seeds: seed(s) [3] only in base"),
        (
            _full("base") + [_record("cand", s, 0.9, 0.9) for s in (1, 2, 4)],
            "seed(s) [4] only in cand, seed(s) [3] only in base",
        ),
        (
            [*_full("base"), *_full("cand")[:2], _record("cand", 3, math.nan, math.nan)],
            "cand excluded (diverged)",
        ),
        (
            [*_full("base"), *_full("cand")[:2], _record("cand", 3, math.nan, 0.9)],
            "cand has no finite value at seed(s) [3]",
        ),
        (
            [*_full("base"), *_full("cand")[:2], _record("cand", 3, None, 0.9)],
            "cand has no finite value at seed(s) [3]",
        ),
        (_full("base", classes=1) + _full("cand", classes=1), "excluded (one_class)"),
    ],
    ids=[
        "missing-seed",
        "unequal-seeds",
        "nan-final",
        "nan-selected",
        "missing-value",
        "one-class",
    ],
)
def test_bad_recipe_tables_are_no_comparison_naming_the_reason(recs, reason):
    comps = _summary(recs)
    named = [c for c in comps.values() if reason in c["reason"]]
    assert named and all(c["verdict"] == "no comparison" for c in named)
    assert all(c["diff"] is None for c in named)
    assert all(reason in c["sentence"] for c in named)


def test_one_seed_per_recipe_is_not_established_with_no_interval():
    comps = _summary([_record("base", 1, 0.9, 0.9), _record("cand", 1, 0.95, 0.95)])
    assert all(c["verdict"] == "not established" for c in comps.values())
    assert all("no interval" in c["sentence"] for c in comps.values())


# ---- telemetry contrasts -------------------------------------------------------------------

pos = st.floats(0.05, 20.0, allow_nan=False)
values = st.fixed_dictionaries({s: pos for s in SEEDS})
factors = st.fixed_dictionaries({s: st.floats(1.0, 3.0) for s in SEEDS})


def _checked(a, b, **kw):
    c = contrast(a, b, scale="ratio", name_a="cand", name_b="base", **kw)
    s = contrast_sentence(c, name_a="cand", name_b="base", quantity="‖g‖", epoch=1)
    named = c.comparison.model_copy(update={"a": "cand", "b": "base"})
    from fathom.stats.results import Claim, Sentence

    res = Results(
        comparisons=[c.comparison],
        sentences=[
            Sentence(
                text=s,
                claims=[
                    Claim(comparison=named.id, verdict=c.verdict, fragile=c.comparison.fragile)
                ],
            )
        ],
    )
    assert check(res) == []
    return c


@settings(max_examples=40, deadline=None)
@given(values, factors, st.floats(0.1, 10.0))
@example({s: 1.0 for s in SEEDS}, {s: 1.0 for s in SEEDS}, 1.0)  # identical arms
def test_contrast_properties(b, f, k):
    lower = {s: b[s] / f[s] for s in SEEDS}  # no higher on any seed
    c = _checked(lower, b)
    assert c.verdict != "higher"
    assert _checked(b, lower).verdict != "lower"
    # swapping the arms mirrors; the same factor on both arms (a shift on the log scale)
    # changes nothing
    assert _checked(b, lower).verdict == MIRROR[c.verdict]
    assert (
        _checked({s: k * v for s, v in lower.items()}, {s: k * v for s, v in b.items()}).verdict
        == c.verdict
    )
    # raising the candidate never turns higher into lower
    raised = {s: b[s] * f[s] for s in SEEDS}
    up = _checked({s: v * f[s] for s, v in raised.items()}, b)
    assert not (_checked(raised, b).verdict == "higher" and up.verdict == "lower")


@pytest.mark.parametrize(
    ("a", "b", "kw", "reason"),
    [
        ({1: 1.0, 2: 1.0}, {1: 1.0, 2: 1.0, 3: 1.0}, {}, "unequal seeds"),
        (
            {1: 1.0, 2: 1.0, 4: 2.0},
            {1: 1.0, 2: 1.0, 3: 1.0},
            {},
            "seed(s) [4] only in cand, seed(s) [3] only in base",
        ),
        (
            {1: 1.0, 2: math.nan, 3: 1.0},
            {1: 1.0, 2: 1.0, 3: 1.0},
            {},
            "cand has no finite value at seed(s) [2]",
        ),
        (
            {1: 1.0, 2: None, 3: 1.0},
            {1: 1.0, 2: 1.0, 3: 1.0},
            {},
            "cand has no finite value at seed(s) [2]",
        ),
        (
            {1: 1.0, 2: 1.0, 3: 1.0},
            {1: 1.0, 2: math.inf, 3: 1.0},
            {},
            "base has no finite value at seed(s) [2]",
        ),
        (
            {1: 1.0, 2: -1.0, 3: 1.0},
            {1: 1.0, 2: 1.0, 3: 1.0},
            {},
            "a value <= 0 at seed(s) [2]: no ratio",
        ),
        (
            {1: 1.0, 2: 1.0},
            {1: 1.0, 2: 1.0},
            {"flags_a": ["one_class"]},
            "cand excluded (one_class)",
        ),
    ],
    ids=["missing-seed", "unequal-seeds", "nan", "none", "inf", "non-positive", "one-class"],
)
def test_bad_contrast_input_is_no_comparison_naming_the_reason(a, b, kw, reason):
    c = _checked(a, b, **kw)
    assert c.verdict == "no comparison" and reason in c.reason and c.estimate is None
