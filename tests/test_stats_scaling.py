"""The depth-scaling verdict: the level and the scaling answered apart. The seed log, the
adversarial tables (each a named regression), bad input, and properties over generated
tables.

The rule changed from one "better / worse scaling" verdict on the mean over depths (which
measured the level, never the scaling) to two answers: ``level`` (better across depths) and
``trend`` (the change from the shallowest to the deepest judged depth and the least-squares
slope; only it says "scales better / worse"). Tests of the old rule were rewritten to the
answer they were about: the mean over depths is now the level.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.stats.chance import chance_test
from fathom.stats.claims import check
from fathom.stats.scaling import depth_scaling_verdict
from fathom.stats.scaling_table import ArmRuns, DepthScalingTable

LOG_DEPTHS = [4, 8, 12, 16, 20]
LOG_VANILLA = [0.614, 0.522, 0.102, 0.037, 0.010]
N_TEST = 10_000
LEVEL_MIRROR = {
    "better across depths": "worse across depths",
    "worse across depths": "better across depths",
}
TREND_MIRROR = {"scales better": "scales worse", "scales worse": "scales better"}


def _arm(accs, seeds=None, status=None):
    seeds = list(seeds) if seeds is not None else list(range(1, len(accs) + 1))
    return ArmRuns(
        test_acc=list(accs), status=list(status or ["complete"] * len(accs)), seeds=seeds
    )


def _jitter(value, n):
    """n per-seed values around ``value`` (deterministic, spread 0.004)."""
    return [value + 0.002 * ((i % 3) - 1) for i in range(n)]


def _verdict(rows, base="vanilla", cand="Lyapunov", classes=100, n_eval=N_TEST):
    v = depth_scaling_verdict(DepthScalingTable(classes, base, cand, rows, n_eval=n_eval))
    assert check(v.results) == []
    return v


def _advantage(adv, base=0.60, step=0.02, n=3):
    """Candidate ``adv[i]`` above a baseline falling by ``step`` per depth, every run trained."""
    return {
        d: {
            "vanilla": _arm(_jitter(base - step * i, n)),
            "Lyapunov": _arm(_jitter(base - step * i + a, n)),
        }
        for i, (d, a) in enumerate(zip(LOG_DEPTHS, adv))
    }


# ---- the seed log ---------------------------------------------------------------------


def test_seed_log_table_gives_no_conclusion():
    rows = {
        d: {"vanilla": _arm([v]), "Lyapunov": _arm([0.010])}
        for d, v in zip(LOG_DEPTHS, LOG_VANILLA)
    }
    v = _verdict(rows)
    assert v.sentence == "no conclusion: the Lyapunov arm failed to train at every depth"
    assert (v.level, v.trend) == ("no conclusion", "no conclusion")
    assert all(v.cells[d]["Lyapunov"] == "failed" for d in LOG_DEPTHS)
    assert [d for d in LOG_DEPTHS if v.cells[d]["vanilla"] == "trained"] == [4, 8, 12, 16]


def test_seed_log_table_with_three_seeds_still_no_conclusion():
    rows = {
        d: {"vanilla": _arm([v, v + 0.01, v - 0.005]), "Lyapunov": _arm([0.010] * 3)}
        for d, v in zip(LOG_DEPTHS, LOG_VANILLA)
    }
    assert (
        _verdict(rows).sentence == "no conclusion: the Lyapunov arm failed to train at every depth"
    )


# ---- level and trend: the counter-examples to "the mean over depths is the scaling" -----


def test_an_advantage_shrinking_with_depth_is_not_better_scaling():
    # +20 pp at depth 4 shrinking to +0.8 pp at depth 20: better across depths, scales worse
    v = _verdict(_advantage([0.20, 0.15, 0.10, 0.05, 0.008]))
    assert v.level == "better across depths"
    assert v.trend == "scales worse"
    assert v.change.estimate == pytest.approx(0.8 - 20.0)
    assert "level: better across depths; scaling: scales worse" in v.sentence


def test_an_advantage_only_at_the_shallowest_depth_is_not_better_scaling():
    v = _verdict(_advantage([0.05, 0, 0, 0, 0]))
    assert v.trend == "scales worse"  # the advantage is gone by depth 8
    assert v.change.estimate == pytest.approx(-5.0)
    assert "scales better" not in v.sentence


def test_a_uniform_advantage_is_a_level_with_no_trend():
    v = _verdict(_advantage([0.05] * 5))
    assert v.level == "better across depths"
    assert v.trend in ("scales equivalently", "not established")
    assert v.change.estimate == pytest.approx(0.0, abs=1e-9)
    assert v.slope.estimate == pytest.approx(0.0, abs=1e-9)
    assert "scales better" not in v.sentence and "scales worse" not in v.sentence
    assert "per depth: better at depth(s) [4, 8, 12, 16, 20]" in v.sentence


def test_permuting_which_depth_holds_which_numbers_changes_the_trend():
    adv = [0.20, 0.15, 0.10, 0.05, 0.008]
    forward = _verdict(_advantage(adv))
    backward = _verdict(_advantage(adv[::-1]))
    assert (forward.trend, backward.trend) == ("scales worse", "scales better")
    assert forward.level == backward.level == "better across depths"


def test_genuine_improvement_at_every_depth_is_reported():
    depths = [4, 8, 12, 16, 20]
    base = {d: [0.62 - 0.03 * i + 0.004 * s for s in range(3)] for i, d in enumerate(depths)}
    cand = {d: [0.63 - 0.005 * i + 0.003 * s for s in range(3)] for i, d in enumerate(depths)}
    v = _verdict({d: {"b": _arm(base[d]), "c": _arm(cand[d])} for d in depths}, "b", "c")
    assert (v.level, v.trend) == ("better across depths", "scales better")
    deltas = [sum(cand[d][s] - base[d][s] for d in depths) / 5 * 100 for s in range(3)]
    assert v.level_contrast.estimate == pytest.approx(sum(deltas) / 3)
    # the slope against a float64 least-squares fit of each seed's difference over depth
    slopes = []
    for s in range(3):
        g = [100 * (cand[d][s] - base[d][s]) for d in depths]
        dm, gm = sum(depths) / 5, sum(g) / 5
        num = sum((d - dm) * (x - gm) for d, x in zip(depths, g))
        slopes.append(num / sum((d - dm) ** 2 for d in depths))
    assert v.slope.estimate == pytest.approx(sum(slopes) / 3)
    assert v.slope.quantity.unit == "pp/layer"


# ---- failures are evidence, chance against chance is not --------------------------------


def test_depths_where_both_arms_failed_join_no_family():
    # trained at two depths (candidate -0.9 pp on every seed), both at chance at seven more
    depths = [4, 8, *range(12, 40, 4)]
    rows = {}
    for i, d in enumerate(depths):
        if i < 2:
            base = _jitter(0.60 - 0.05 * i, 3)
            rows[d] = {"b": _arm(base), "c": _arm([x - 0.009 for x in base])}
        else:
            rows[d] = {"b": _arm([0.010] * 3), "c": _arm([0.009] * 3)}
    v = _verdict(rows, "b", "c")
    only_trained = _verdict({d: rows[d] for d in depths[:2]}, "b", "c")
    assert v.both_failed == depths[2:]
    assert v.scenarios[0].depths == [4, 8]
    assert v.level_contrast.family_size == only_trained.level_contrast.family_size == 5
    assert (v.level, v.trend) == (only_trained.level, only_trained.trend)
    assert v.level_contrast.estimate == pytest.approx(-0.9)
    assert "left out: depth(s) [12, 16" in v.sentence


def test_a_candidate_failing_where_the_baseline_trains_is_evidence_not_a_dropped_depth():
    # candidate fails 12 of 15 runs at three depths where the baseline trains at 60% (and
    # one run per depth is undetermined); better at the two others. The old rule dropped
    # the three depths and said "better scaling".
    rows = {d: {"vanilla": _arm(_jitter(0.60, 5)), "Lyapunov": _arm(_jitter(0.65, 5))}
            for d in (4, 8)}  # fmt: skip
    for d in (12, 16, 20):
        rows[d] = {
            "vanilla": _arm(_jitter(0.60, 5)),
            "Lyapunov": _arm([0.010, 0.009, 0.011, 0.010, 0.0156]),
        }
    v = _verdict(rows)
    assert [f.depth for f in v.undetermined] == [12, 16, 20]
    assert all(s.depths == LOG_DEPTHS for s in v.scenarios)
    assert v.level != "better across depths" and "better across depths" not in v.headline
    assert v.trend == "scales worse"
    assert {e.depth for s in v.scenarios for e in s.evidence} == {12, 16, 20}
    assert all(e.direction == "against" for s in v.scenarios for e in s.evidence)


def test_raising_one_seed_into_the_undetermined_band_changes_no_answer():
    # 640 test examples, 100 classes: 1.56% failed, 3.12% undetermined. The old rule turned
    # "better scaling" into "inconclusive" by dropping the depth.
    rows = {
        d: {
            "vanilla": _arm(_jitter(0.40 - 0.05 * i, 5)),
            "Lyapunov": _arm(_jitter(0.50 - 0.05 * i, 5)),
        }
        for i, d in enumerate(LOG_DEPTHS)
    }
    rows[20] = {"vanilla": _arm([0.010] * 5), "Lyapunov": _arm([0.30] * 4 + [1 / 64])}
    low = _verdict(rows, n_eval=640)
    rows[20]["Lyapunov"] = _arm([0.30] * 4 + [2 / 64])
    high = _verdict(rows, n_eval=640)
    assert low.undetermined == [] and len(high.undetermined) == 1
    assert [s.reading for s in high.scenarios] == ["at chance", "at their values"]
    assert (high.level, high.trend) == (low.level, low.trend)
    assert low.level == "better across depths"


def test_an_undetermined_run_stands_only_where_both_readings_agree():
    rows = _advantage([0.05] * 5)
    rows[20] = {"vanilla": _arm([0.60] * 3), "Lyapunov": _arm([0.70, 0.70, 0.0156])}
    v = _verdict(rows)
    at_chance, at_value = v.scenarios
    assert (at_chance.reading, at_value.reading) == ("at chance", "at their values")
    for answer in ("level", "trend"):
        a, b = getattr(at_chance, answer), getattr(at_value, answer)
        assert getattr(v, answer) == (a if a == b else "not established")
    assert "read both ways" in v.sentence and "Lyapunov seed 3 at depth 20 (1.56%)" in v.sentence


def test_knife_edge_gives_the_level_its_due_and_the_trend_its_own():
    # candidate 20–39 pp worse at 4..16; at 20 both arms a hair either side of the old 2/C
    # cut. Under the old rule this read "worse scaling": it is worse across depths, and its
    # gap narrows with depth (both readings of the undetermined depth agree).
    edge = 2 / 100
    rows = {
        4: {"vanilla": _arm(_jitter(0.60, 3)), "Lyapunov": _arm(_jitter(0.21, 3))},
        8: {"vanilla": _arm(_jitter(0.55, 3)), "Lyapunov": _arm(_jitter(0.30, 3))},
        12: {"vanilla": _arm(_jitter(0.50, 3)), "Lyapunov": _arm(_jitter(0.28, 3))},
        16: {"vanilla": _arm(_jitter(0.45, 3)), "Lyapunov": _arm(_jitter(0.25, 3))},
        20: {"vanilla": _arm([edge - 0.0001] * 3), "Lyapunov": _arm([edge + 0.0001] * 3)},
    }
    v = _verdict(rows)
    assert v.level == "worse across depths" and "better across depths" not in v.sentence
    assert v.cells[20] == {"vanilla": "undetermined", "Lyapunov": "undetermined"}
    assert v.scenarios[0].depths == [4, 8, 12, 16]  # at chance: depth 20 is chance vs chance
    assert v.scenarios[1].depths == LOG_DEPTHS
    assert v.trend == "scales better"


@pytest.mark.parametrize("where", [4, 12])
def test_one_baseline_failure_does_not_beat_everything(where):
    rows = {
        d: {
            "vanilla": _arm(_jitter(0.60 - 0.02 * i, 3)),
            "Lyapunov": _arm(_jitter(0.35 - 0.02 * i, 3)),
        }
        for i, d in enumerate(LOG_DEPTHS)
    }
    rows[where]["vanilla"] = _arm([0.010] * 3)
    v = _verdict(rows)
    assert v.level in ("worse across depths", "inconclusive")
    assert "better across depths" not in v.sentence
    assert v.scenarios[0].depths == LOG_DEPTHS  # the failing depth enters at chance
    assert v.per_depth[where].verdict == "better"
    if v.level == "inconclusive":
        assert f"depth {where} is better" in v.sentence


def test_a_different_seed_failing_at_each_depth_is_not_said_to_fail_everywhere():
    rows = {}
    for i, d in enumerate([4, 8, 12]):
        accs = _jitter(0.50, 3)
        accs[i] = 0.010
        rows[d] = {"vanilla": _arm(_jitter(0.55, 3)), "Lyapunov": _arm(accs)}
    v = _verdict(rows)
    assert "failed everywhere" not in v.sentence
    assert v.verdict == "judged"
    assert all(v.cells[d]["Lyapunov"] == "partial" for d in rows)


def test_identical_per_seed_differences_are_no_point_interval():
    rows = {d: {"b": _arm([0.50, 0.52, 0.54]), "c": _arm([0.501, 0.521, 0.541])} for d in (4, 8)}
    v = _verdict(rows, "b", "c")
    assert v.level_contrast.high - v.level_contrast.low > 0.5
    assert v.level != "better across depths"


def test_a_tenth_of_a_point_from_two_seeds_is_not_better_across_depths():
    rows = {
        4: {"b": _arm([0.60, 0.61]), "c": _arm([0.601, 0.611])},
        8: {"b": _arm([0.50, 0.52]), "c": _arm([0.501, 0.521])},
    }
    assert _verdict(rows, "b", "c").level != "better across depths"


def test_candidate_failing_deeper_enters_at_chance():
    rows = {
        4: {"vanilla": _arm(_jitter(0.60, 3)), "Lyapunov": _arm(_jitter(0.55, 3))},
        8: {"vanilla": _arm(_jitter(0.50, 3)), "Lyapunov": _arm(_jitter(0.48, 3))},
        12: {"vanilla": _arm(_jitter(0.30, 3)), "Lyapunov": _arm([0.008] * 3)},
        16: {"vanilla": _arm(_jitter(0.10, 3)), "Lyapunov": _arm([0.012] * 3)},
    }
    v = _verdict(rows)
    assert v.level == "worse across depths" and v.scenarios[0].depths == [4, 8, 12, 16]
    assert v.level_contrast.estimate == pytest.approx(
        100 * ((0.55 - 0.6) + (0.48 - 0.5) + (0.01 - 0.3) + (0.01 - 0.1)) / 4
    )


def test_diverged_runs_enter_at_chance():
    n = 3
    rows = {
        4: {"b": _arm(_jitter(0.60, n)), "c": _arm(_jitter(0.60, n))},
        8: {"b": _arm([math.nan] * n, status=["diverged"] * n), "c": _arm(_jitter(0.45, n))},
    }
    v = _verdict(rows, "b", "c", classes=10)
    assert v.cells[8]["b"] == "failed"
    assert v.per_depth[8].estimate == pytest.approx(100 * (0.45 - 0.1))


def test_equivalent_profiles():
    rows = {
        d: {"b": _arm(_jitter(0.6 - 0.05 * i, 6)), "c": _arm(_jitter(0.6 - 0.05 * i, 6))}
        for i, d in enumerate((4, 8, 12))
    }
    v = _verdict(rows, "b", "c", n_eval=100_000)
    assert (v.level, v.trend) == ("equivalent across depths", "scales equivalently")


# ---- bad input: a clear "no comparison", never an exception or a verdict ---------------

TWO = {4: {"b": _arm([0.5, 0.6]), "c": _arm([0.5, 0.6])}, 8: {"b": _arm([0.5]), "c": _arm([0.5])}}


def _two(b4, c4, b8=None, c8=None):
    return {4: {"b": b4, "c": c4}, 8: {"b": b8 or _arm([0.5, 0.6]), "c": c8 or _arm([0.5, 0.6])}}


BAD = {
    "single-depth": ({4: {"b": _arm([0.5, 0.6]), "c": _arm([0.5, 0.6])}}, 10, N_TEST, "1 depth(s)"),
    "one-class": (_two(_arm([0.5, 0.6]), _arm([0.5, 0.6])), 1, N_TEST, "1 class(es)"),
    "unequal-seeds": (_two(_arm([0.5, 0.6]), _arm([0.5])), 10, N_TEST, "unequal seeds"),
    "missing-seeds": (
        _two(_arm([0.5, 0.6]), _arm([0.5, 0.6], seeds=[1, 3])), 10, N_TEST, "unequal seeds"
    ),
    "nan": (_two(_arm([0.5, math.nan]), _arm([0.5, 0.6])), 10, N_TEST, "not finite"),
    "incomplete": (
        _two(_arm([0.5, 0.6], status=["complete", "failed"]), _arm([0.5, 0.6])),
        10, N_TEST, "missing seed",
    ),
    "missing-arm": (
        {4: {"b": _arm([0.5])}, 8: {"b": _arm([0.5]), "c": _arm([0.5])}}, 10, N_TEST, "lacks arm"
    ),
    "no-test-size": (_two(_arm([0.5, 0.6]), _arm([0.5, 0.6])), 10, None, "test-set size"),
    "percent": (_two(_arm([50.0, 61.4]), _arm([52.0, 60.0])), 10, N_TEST, "divide by 100"),
    "negative": (_two(_arm([-0.05, 0.6]), _arm([0.5, 0.6])), 10, N_TEST, "outside [0, 1]"),
    "above-one": (_two(_arm([1.5, 0.6]), _arm([0.5, 0.6])), 10, N_TEST, "divide by 100"),
    "far-above": (_two(_arm([150.0, 0.6]), _arm([0.5, 0.6])), 10, N_TEST, "outside [0, 1]"),
    "mixed-depth-keys": (
        {4: TWO[4], "8": TWO[4]}, 10, N_TEST, "depth keys [4, '8'] are not all integers"
    ),
    "string-seeds": (
        _two(_arm([0.5, 0.6], seeds=["1", "2"]), _arm([0.5, 0.6], seeds=["1", "2"])),
        10, N_TEST, "are not all integers",
    ),
    "status-none": (
        _two(_arm([0.5, 0.6], status=[None, "complete"]), _arm([0.5, 0.6])),
        10, N_TEST, "unknown status None",
    ),
    "status-list-none": (
        _two(ArmRuns(test_acc=[0.5, 0.6], status=None), _arm([0.5, 0.6])),  # type: ignore[arg-type]
        10, N_TEST, "status must be a list",
    ),
    "string-accuracy": (_two(_arm(["0.5", 0.6]), _arm([0.5, 0.6])), 10, N_TEST, "not all numbers"),
    "float-classes": (_two(_arm([0.5, 0.6]), _arm([0.5, 0.6])), 10.5, N_TEST, "not an integer"),
    "float-test-size": (_two(_arm([0.5, 0.6]), _arm([0.5, 0.6])), 10, 1e4, "not an integer"),
}  # fmt: skip


@pytest.mark.parametrize(("rows", "classes", "n_eval", "reason"), BAD.values(), ids=BAD.keys())
def test_bad_input_is_no_comparison(rows, classes, n_eval, reason):
    v = depth_scaling_verdict(DepthScalingTable(classes, "b", "c", rows, n_eval=n_eval))
    assert (v.verdict, v.level, v.trend) == ("no comparison",) * 3
    assert v.sentence.startswith("no comparison: ") and reason in v.sentence


def test_numpy_numbers_are_numbers():
    """Depths, seeds, counts and accuracies read from NumPy arrays are judged as the same
    Python numbers are."""
    rows = _advantage([0.05] * 5)
    as_np = {
        np.int64(d): {
            arm: ArmRuns(
                test_acc=[np.float64(a) for a in runs.test_acc],
                status=runs.status,
                seeds=[np.int64(s) for s in runs.seed_ids()],
            )
            for arm, runs in cells.items()
        }
        for d, cells in rows.items()
    }
    v = _verdict(rows)
    w = _verdict(as_np, classes=np.int64(100), n_eval=np.int64(N_TEST))
    assert (w.verdict, w.level, w.trend) == (v.verdict, v.level, v.trend)


# ---- properties over generated tables ---------------------------------------------------


@st.composite
def tables(draw, classes=None):
    n_depths, n_seeds = draw(st.integers(2, 4)), draw(st.integers(2, 4))
    classes = classes or draw(st.sampled_from([2, 10, 100]))
    acc = st.floats(0.0, 1.0, allow_nan=False)
    base = [[draw(acc) for _ in range(n_seeds)] for _ in range(n_depths)]
    cand = [[draw(acc) for _ in range(n_seeds)] for _ in range(n_depths)]
    return classes, base, cand


def _table(classes, base, cand, names=("b", "c"), n_eval=2000, depths=None):
    depths = depths or [4 * (i + 1) for i in range(len(base))]
    rows = {d: {names[0]: _arm(b), names[1]: _arm(c)} for d, b, c in zip(depths, base, cand)}
    return DepthScalingTable(classes, names[0], names[1], rows, n_eval=n_eval)


def _answers(v):
    return v.level, v.trend


def _trained(t):
    """Every run trained, before and after a shift of ±0.15 (10 classes)."""
    classes, base, cand = t
    squash = lambda x: 0.3 + 0.4 * x  # noqa: E731
    return classes, [[squash(x) for x in r] for r in base], [[squash(x) for x in r] for r in cand]


@settings(max_examples=50, deadline=None)
@given(tables())
@example((10, [[0.6, 0.6], [0.5, 0.5]], [[0.6, 0.6], [0.5, 0.5]]))
def test_generated_tables_mirror_under_swapped_arms(t):
    classes, base, cand = t
    v = depth_scaling_verdict(_table(classes, base, cand))
    assert check(v.results) == []
    w = depth_scaling_verdict(_table(classes, cand, base, names=("c", "b")))
    assert w.level == LEVEL_MIRROR.get(v.level, v.level)
    assert w.trend == TREND_MIRROR.get(v.trend, v.trend)


@settings(max_examples=40, deadline=None)
@given(tables())
def test_reversing_the_depth_order_reverses_the_trend(t):
    classes, base, cand = t
    v = depth_scaling_verdict(_table(classes, base, cand))
    w = depth_scaling_verdict(_table(classes, base[::-1], cand[::-1]))
    assert w.trend == TREND_MIRROR.get(v.trend, v.trend)
    assert w.level == v.level


@settings(max_examples=40, deadline=None)
@given(tables(classes=10), st.floats(-0.15, 0.15), st.sampled_from(["both", "base", "cand"]))
def test_a_constant_shift_never_changes_the_trend(t, shift, which):
    classes, base, cand = _trained(t)
    v = depth_scaling_verdict(_table(classes, base, cand))
    moved = [[[x + shift for x in r] for r in arm] for arm in (base, cand)]
    b2 = moved[0] if which in ("both", "base") else base
    c2 = moved[1] if which in ("both", "cand") else cand
    w = depth_scaling_verdict(_table(classes, b2, c2))
    assert w.trend == v.trend
    if which == "both":  # a common shift changes the level neither
        assert w.level == v.level


@settings(max_examples=40, deadline=None)
@given(tables(classes=10))
def test_percent_tables_are_refused_never_judged_differently(t):
    classes, base, cand = t
    cand[0][0] = max(cand[0][0], 0.02)  # one accuracy above 1%: its percent exceeds 1
    v = depth_scaling_verdict(_table(classes, base, cand))
    pct = depth_scaling_verdict(
        _table(classes, [[100 * x for x in r] for r in base], [[100 * x for x in r] for r in cand])
    )
    assert _answers(pct) == _answers(v) or "divide by 100" in pct.sentence
    assert pct.verdict == "no comparison"


@settings(max_examples=40, deadline=None)
@given(tables(classes=10), st.data())
def test_chance_against_chance_depths_never_change_an_answer(t, data):
    classes, base, cand = t
    n_seeds = len(base[0])
    at_chance = st.floats(0.0, 0.1, allow_nan=False)
    extra = data.draw(st.integers(1, 3))
    depths = [4 * (i + 1) for i in range(len(base) + extra)]
    where = sorted(data.draw(st.permutations(depths))[:extra])
    kept = [d for d in depths if d not in where]
    b2, c2, it = [], [], iter(zip(base, cand))
    for d in depths:
        if d in where:  # a depth where every run of both arms is at or below chance
            b2.append([data.draw(at_chance) for _ in range(n_seeds)])
            c2.append([data.draw(at_chance) for _ in range(n_seeds)])
        else:
            b, c = next(it)
            b2.append(b)
            c2.append(c)
    v = depth_scaling_verdict(_table(classes, base, cand, depths=kept))
    w = depth_scaling_verdict(_table(classes, b2, c2, depths=depths))
    assert check(w.results) == []
    assert _answers(w) == _answers(v)


@st.composite
def dominated(draw):
    """A baseline table and a candidate no better than it at every depth on every seed."""
    classes, base, _ = draw(tables())
    gap = st.floats(0.0, 0.3, allow_nan=False)
    cand = [[max(0.0, b - draw(gap)) for b in row] for row in base]
    return classes, base, cand


@settings(max_examples=40, deadline=None)
@given(dominated())
@example((10, [[0.6, 0.6], [0.5, 0.5]], [[0.6, 0.6], [0.5, 0.5]]))  # identical arms
def test_no_better_at_every_depth_on_every_seed_is_never_better_across_depths(t):
    classes, base, cand = t
    v = depth_scaling_verdict(_table(classes, base, cand))
    assert v.level != "better across depths" and check(v.results) == []
    w = depth_scaling_verdict(_table(classes, cand, base, names=("c", "b")))
    assert w.level != "worse across depths"


@settings(max_examples=40, deadline=None)
@given(tables(classes=10), st.data())
def test_improving_the_candidate_never_turns_better_across_depths_into_worse(t, data):
    classes, base, _ = t
    lead = st.floats(0.0, 0.3, allow_nan=False)
    cand = [[min(1.0, b + data.draw(lead)) for b in row] for row in base]
    up = [[min(1.0, c + data.draw(lead)) for c in row] for row in cand]
    v = depth_scaling_verdict(_table(classes, base, cand))
    w = depth_scaling_verdict(_table(classes, base, up))
    assert check(w.results) == []
    if v.level == "better across depths":
        assert w.level != "worse across depths"


def _band(n_eval, classes, state):
    """Accuracies in ``state`` against chance just above it (brute force over counts)."""
    ks = range(n_eval // classes, n_eval // classes + n_eval // 20)
    return [
        k / n_eval
        for k in ks
        if chance_test(k / n_eval, n_eval=n_eval, classes=classes).state == state
    ]


BAND = _band(2000, 10, "undetermined")
FAILED_ABOVE_CHANCE = _band(2000, 10, "failed")


@settings(max_examples=30, deadline=None)
@given(tables(classes=10), st.data())
def test_a_run_raised_into_the_undetermined_band_keeps_its_answers_or_none(t, data):
    """A failed run raised into the undetermined band: each answer is the one the table
    gives with the run failed, or not established (never another established answer)."""
    classes, base, cand = t
    i = data.draw(st.integers(0, len(base) - 1))
    j = data.draw(st.integers(0, len(base[0]) - 1))
    arm = data.draw(st.sampled_from(["base", "cand"]))
    out = []
    for value in (
        data.draw(st.sampled_from(FAILED_ABOVE_CHANCE)),
        data.draw(st.sampled_from(BAND)),
    ):
        b, c = [r[:] for r in base], [r[:] for r in cand]
        (b if arm == "base" else c)[i][j] = value
        out.append(depth_scaling_verdict(_table(classes, b, c)))
    failed, raised = out
    assert check(raised.results) == []
    if failed.verdict == raised.verdict == "judged":
        assert raised.level in (failed.level, "not established")
        assert raised.trend in (failed.trend, "not established")


def test_a_reading_without_two_depths_leaves_both_answers_not_established():
    # at chance, depth 8 is chance against chance (one depth left: no comparison); at its
    # value the undetermined candidate gives two depths: the readings cannot agree
    rows = {
        4: {"b": _arm(_jitter(0.60, 3)), "c": _arm(_jitter(0.70, 3))},
        8: {"b": _arm([0.010] * 3), "c": _arm([0.0156] * 3)},
    }
    v = _verdict(rows, "b", "c")
    at_chance, at_value = v.scenarios
    assert at_chance.level == "no comparison" and at_chance.depths == [4]
    assert at_value.depths == [4, 8] and at_value.level != "no comparison"
    assert (v.verdict, v.level, v.trend) == ("judged", "not established", "not established")
    assert "[undetermined runs at chance] no comparison: 1 depth(s) [4]" in v.sentence
