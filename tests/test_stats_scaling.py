"""The depth-scaling verdict on the whole profile: the seed log, the issue's adversarial
tables (each a named regression), bad input, and properties over generated tables."""

from __future__ import annotations

import math

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
MIRROR = {"better scaling": "worse scaling", "worse scaling": "better scaling"}


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


# ---- the seed log ---------------------------------------------------------------------


def test_seed_log_table_gives_no_conclusion():
    rows = {
        d: {"vanilla": _arm([v]), "Lyapunov": _arm([0.010])}
        for d, v in zip(LOG_DEPTHS, LOG_VANILLA)
    }
    v = _verdict(rows)
    assert v.sentence == "no conclusion: the Lyapunov arm failed to train at every depth"
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


# ---- the tables, each a named regression ---------------------------------------


def _knife_edge(classes):
    """Candidate 20–39 pp worse at 4..16; at 20 a hair above the old 2/C cut, baseline a hair below."""
    edge = 2 / classes
    return {
        4: {"vanilla": _arm(_jitter(0.60, 3)), "Lyapunov": _arm(_jitter(0.21, 3))},
        8: {"vanilla": _arm(_jitter(0.55, 3)), "Lyapunov": _arm(_jitter(0.30, 3))},
        12: {"vanilla": _arm(_jitter(0.50, 3)), "Lyapunov": _arm(_jitter(0.28, 3))},
        16: {"vanilla": _arm(_jitter(0.45, 3)), "Lyapunov": _arm(_jitter(0.25, 3))},
        20: {"vanilla": _arm([edge - 0.0001] * 3), "Lyapunov": _arm([edge + 0.0001] * 3)},
    }


@pytest.mark.parametrize("classes", [100, 10])
def test_knife_edge_never_beats_the_evidence(classes):
    v = _verdict(_knife_edge(classes), classes=classes)
    assert v.verdict == "worse scaling"
    assert "better" not in v.sentence
    assert v.profile.high < 0
    if classes == 100:  # 2% on 10,000 examples is neither failed nor clearly trained
        assert v.determined == [4, 8, 12, 16] and v.cells[20]["Lyapunov"] == "undetermined"
        assert "depth 20: undetermined against chance" in v.sentence
    else:  # 20% of 10 classes is trained: it enters as the accuracy it is
        assert v.determined == LOG_DEPTHS


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
    assert v.verdict in ("worse scaling", "inconclusive")
    assert "better scaling" not in v.sentence
    assert v.determined == LOG_DEPTHS  # the failing depth enters as 1%, nothing is dropped
    assert v.per_depth[where].verdict == "better"
    if v.verdict == "inconclusive":
        assert f"depth {where} is better" in v.sentence


def test_a_different_seed_failing_at_each_depth_is_not_said_to_fail_everywhere():
    rows = {}
    for i, d in enumerate([4, 8, 12]):
        accs = _jitter(0.50, 3)
        accs[i] = 0.010
        rows[d] = {"vanilla": _arm(_jitter(0.55, 3)), "Lyapunov": _arm(accs)}
    v = _verdict(rows)
    assert "failed everywhere" not in v.sentence
    assert v.verdict != "no conclusion"
    assert all(v.cells[d]["Lyapunov"] == "partial" for d in rows)


def test_identical_per_seed_differences_are_no_point_interval():
    rows = {d: {"b": _arm([0.50, 0.52, 0.54]), "c": _arm([0.501, 0.521, 0.541])} for d in (4, 8)}
    v = _verdict(rows, "b", "c")
    assert v.profile.high - v.profile.low > 0.5
    assert v.verdict != "better scaling"


def test_a_tenth_of_a_point_from_two_seeds_is_not_better_scaling():
    rows = {
        4: {"b": _arm([0.60, 0.61]), "c": _arm([0.601, 0.611])},
        8: {"b": _arm([0.50, 0.52]), "c": _arm([0.501, 0.521])},
    }
    assert _verdict(rows, "b", "c").verdict != "better scaling"


def test_candidate_failing_deeper_is_worse_scaling_failure_entering_as_low_accuracy():
    rows = {
        4: {"vanilla": _arm(_jitter(0.60, 3)), "Lyapunov": _arm(_jitter(0.55, 3))},
        8: {"vanilla": _arm(_jitter(0.50, 3)), "Lyapunov": _arm(_jitter(0.48, 3))},
        12: {"vanilla": _arm(_jitter(0.30, 3)), "Lyapunov": _arm([0.010] * 3)},
        16: {"vanilla": _arm(_jitter(0.10, 3)), "Lyapunov": _arm([0.010] * 3)},
    }
    v = _verdict(rows)
    assert v.verdict == "worse scaling" and v.determined == [4, 8, 12, 16]
    assert v.profile.estimate == pytest.approx(
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
    assert v.verdict == "equivalent scaling"


def test_genuine_improvement_at_every_depth_is_reported():
    depths = [4, 8, 12, 16, 20]
    base = {d: [0.62 - 0.03 * i + 0.004 * s for s in range(3)] for i, d in enumerate(depths)}
    cand = {d: [0.63 - 0.005 * i + 0.003 * s for s in range(3)] for i, d in enumerate(depths)}
    v = _verdict({d: {"b": _arm(base[d]), "c": _arm(cand[d])} for d in depths}, "b", "c")
    assert v.verdict == "better scaling"
    deltas = [sum(cand[d][s] - base[d][s] for d in depths) / 5 * 100 for s in range(3)]
    assert v.profile.estimate == pytest.approx(sum(deltas) / 3)


# ---- bad input: a clear "no comparison", never an exception or a verdict ---------------


@pytest.mark.parametrize(
    ("rows", "classes", "n_eval", "reason"),
    [
        ({4: {"b": _arm([0.5, 0.6]), "c": _arm([0.5, 0.6])}}, 10, N_TEST, "1 depth(s)"),
        (
            {4: {"b": _arm([0.5]), "c": _arm([0.5])}, 8: {"b": _arm([0.5]), "c": _arm([0.5])}},
            1,
            N_TEST,
            "1 class(es)",
        ),
        (
            {
                4: {"b": _arm([0.5, 0.6]), "c": _arm([0.5])},
                8: {"b": _arm([0.5, 0.6]), "c": _arm([0.5, 0.6])},
            },
            10,
            N_TEST,
            "unequal seeds",
        ),
        (
            {
                4: {"b": _arm([0.5, 0.6]), "c": _arm([0.5, 0.6], seeds=[1, 3])},
                8: {"b": _arm([0.5, 0.6]), "c": _arm([0.5, 0.6])},
            },
            10,
            N_TEST,
            "unequal seeds",
        ),
        (
            {
                4: {"b": _arm([0.5, math.nan]), "c": _arm([0.5, 0.6])},
                8: {"b": _arm([0.5, 0.6]), "c": _arm([0.5, 0.6])},
            },
            10,
            N_TEST,
            "not finite",
        ),
        (
            {
                4: {"b": _arm([0.5, 0.6], status=["complete", "failed"]), "c": _arm([0.5, 0.6])},
                8: {"b": _arm([0.5, 0.6]), "c": _arm([0.5, 0.6])},
            },
            10,
            N_TEST,
            "missing seed",
        ),
        ({4: {"b": _arm([0.5])}, 8: {"b": _arm([0.5]), "c": _arm([0.5])}}, 10, N_TEST, "lacks arm"),
        (
            {4: {"b": _arm([0.5]), "c": _arm([0.5])}, 8: {"b": _arm([0.5]), "c": _arm([0.5])}},
            10,
            None,
            "test-set size is unknown",
        ),
    ],
    ids=[
        "single-depth",
        "one-class",
        "unequal-seeds",
        "missing-seeds",
        "nan",
        "incomplete",
        "missing-arm",
        "no-test-size",
    ],
)
def test_bad_input_is_no_comparison(rows, classes, n_eval, reason):
    v = depth_scaling_verdict(DepthScalingTable(classes, "b", "c", rows, n_eval=n_eval))
    assert v.verdict == "no comparison"
    assert reason in v.sentence


# ---- properties over generated tables ---------------------------------------------------


@st.composite
def tables(draw, classes=None):
    n_depths, n_seeds = draw(st.integers(2, 4)), draw(st.integers(2, 4))
    classes = classes or draw(st.sampled_from([2, 10, 100]))
    acc = st.floats(0.0, 1.0, allow_nan=False)
    base = [[draw(acc) for _ in range(n_seeds)] for _ in range(n_depths)]
    cand = [[draw(acc) for _ in range(n_seeds)] for _ in range(n_depths)]
    return classes, base, cand


def _table(classes, base, cand, names=("b", "c"), n_eval=2000):
    rows = {
        4 * (i + 1): {names[0]: _arm(b), names[1]: _arm(c)}
        for i, (b, c) in enumerate(zip(base, cand))
    }
    return DepthScalingTable(classes, names[0], names[1], rows, n_eval=n_eval)


@settings(max_examples=60)
@given(tables())
@example((10, [[0.6, 0.6], [0.5, 0.5]], [[0.6, 0.6], [0.5, 0.5]]))
def test_generated_tables(t):
    classes, base, cand = t
    v = depth_scaling_verdict(_table(classes, base, cand))
    assert check(v.results) == []
    # swapping the arms mirrors the verdict
    w = depth_scaling_verdict(_table(classes, cand, base, names=("c", "b")))
    assert w.verdict == MIRROR.get(v.verdict, v.verdict)
    # no better on every depth and seed: never better scaling (and symmetrically)
    if all(c <= b for bs, cs in zip(base, cand) for b, c in zip(bs, cs)):
        assert v.verdict != "better scaling"
    if all(c >= b for bs, cs in zip(base, cand) for b, c in zip(bs, cs)):
        assert v.verdict != "worse scaling"
    # improving the candidate never turns better into worse
    up = [[min(1.0, c + 0.05) for c in cs] for cs in cand]
    if v.verdict == "better scaling":
        assert depth_scaling_verdict(_table(classes, base, up)).verdict != "worse scaling"


@settings(max_examples=40)
@given(tables(classes=10), st.floats(-0.15, 0.15))
def test_a_common_shift_changes_nothing(t, shift):
    classes, base, cand = t
    squash = lambda x: 0.3 + 0.4 * x  # noqa: E731  (every run trained, before and after)
    base = [[squash(x) for x in r] for r in base]
    cand = [[squash(x) for x in r] for r in cand]
    v = depth_scaling_verdict(_table(classes, base, cand))
    moved = depth_scaling_verdict(
        _table(
            classes, [[x + shift for x in r] for r in base], [[x + shift for x in r] for r in cand]
        )
    )
    assert moved.verdict == v.verdict


def _band(n_eval, classes):
    """Accuracies undetermined against chance at this size and class count (brute force)."""
    ks = range(n_eval // classes, n_eval // classes + n_eval // 20)
    return [
        k / n_eval
        for k in ks
        if chance_test(k / n_eval, n_eval=n_eval, classes=classes).state == "undetermined"
    ]


BAND = _band(2000, 10)


@settings(max_examples=40)
@given(tables(classes=10), st.data())
def test_a_verdict_never_depends_on_a_cell_in_the_undetermined_band(t, data):
    classes, base, cand = t
    i = data.draw(st.integers(0, len(base) - 1))
    j = data.draw(st.integers(0, len(base[0]) - 1))
    arm = data.draw(st.sampled_from(["base", "cand"]))
    x, y = data.draw(st.sampled_from(BAND)), data.draw(st.sampled_from(BAND))
    out = []
    for value in (x, y):
        b, c = [r[:] for r in base], [r[:] for r in cand]
        (b if arm == "base" else c)[i][j] = value
        out.append(depth_scaling_verdict(_table(classes, b, c)))
    assert out[0].verdict == out[1].verdict
    assert (
        out[0].sentence.split(";")[0].split(":")[0] == out[1].sentence.split(";")[0].split(":")[0]
    )


@st.composite
def dominated(draw):
    """A baseline table and a candidate no better than it at every depth on every seed."""
    classes, base, _ = draw(tables())
    gap = st.floats(0.0, 0.3, allow_nan=False)
    cand = [[max(0.0, b - draw(gap)) for b in row] for row in base]
    return classes, base, cand


@settings(max_examples=40)
@given(dominated())
@example((10, [[0.6, 0.6], [0.5, 0.5]], [[0.6, 0.6], [0.5, 0.5]]))  # identical arms
def test_no_better_at_every_depth_on_every_seed_is_never_better_scaling(t):
    classes, base, cand = t
    v = depth_scaling_verdict(_table(classes, base, cand))
    assert v.verdict != "better scaling" and check(v.results) == []
    # and symmetrically, the baseline seen as the candidate is never worse scaling
    w = depth_scaling_verdict(_table(classes, cand, base, names=("c", "b")))
    assert w.verdict != "worse scaling"


@settings(max_examples=40)
@given(tables(classes=10), st.data())
def test_improving_the_candidate_never_turns_better_scaling_into_worse(t, data):
    classes, base, _ = t
    lead = st.floats(0.0, 0.3, allow_nan=False)
    cand = [[min(1.0, b + data.draw(lead)) for b in row] for row in base]
    up = [[min(1.0, c + data.draw(lead)) for c in row] for row in cand]
    v = depth_scaling_verdict(_table(classes, base, cand))
    w = depth_scaling_verdict(_table(classes, base, up))
    assert check(w.results) == []
    if v.verdict == "better scaling":
        assert w.verdict != "worse scaling"
