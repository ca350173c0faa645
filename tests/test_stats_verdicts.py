"""The verdict engine on adversarial tables, and the depth-scaling log that lied."""

import math

import pytest

from fathom.errors import FathomError
from fathom.stats.flags import failure_flags
from fathom.stats.intervals import Interval, paired_difference
from fathom.stats.verdicts import (
    ArmRuns,
    DepthScalingTable,
    compare,
    depth_scaling_verdict,
    first_crossing,
    rank_disagreement,
    verdict_sentence,
)


def _iv(est, low, high, n=3):
    return Interval(est, low, high, n, 0.95, "paired t")


@pytest.mark.parametrize(
    ("diff", "higher_is_better", "expected"),
    [
        pytest.param(_iv(0.01, 0.004, 0.016), True, "better", id="above-zero-higher-better"),
        pytest.param(_iv(0.01, 0.004, 0.016), False, "worse", id="above-zero-lower-better"),
        pytest.param(_iv(-0.01, -0.02, -0.001), True, "worse", id="below-zero-higher-better"),
        pytest.param(_iv(-0.01, -0.02, -0.001), False, "better", id="below-zero-lower-better"),
        pytest.param(_iv(0.01, -0.002, 0.02), True, "not established", id="crossing-zero"),
        pytest.param(
            Interval(0.05, None, None, 1, 0.95, "paired t"), True, "not established", id="n1"
        ),
    ],
)
def test_compare_reads_the_interval(diff, higher_is_better, expected):
    v = compare(diff, higher_is_better=higher_is_better, flags_a=[], flags_b=[])
    assert v.verdict == expected


def test_interval_crossing_zero_sentence_makes_no_claim():
    a = {101: 0.981, 102: 0.975, 103: 0.979}
    b = {101: 0.978, 102: 0.977, 103: 0.976}
    diff = paired_difference(a, b)
    assert diff.low < 0 < diff.high
    v = compare(diff, higher_is_better=True, flags_a=[], flags_b=[])
    text = verdict_sentence(v, name_a="sd", name_b="plain", metric="test accuracy")
    assert v.verdict == "not established"
    assert text.startswith("sd vs plain on test accuracy: not established")
    assert "includes zero" in text
    assert "better" not in text


def test_n1_sentence_says_no_interval():
    diff = paired_difference({1: 0.9}, {1: 0.8})
    v = compare(diff, higher_is_better=True, flags_a=[], flags_b=[])
    text = verdict_sentence(v, name_a="x", name_b="y", metric="acc")
    assert v.verdict == "not established"
    assert "no interval" in text


def test_diverged_arm_is_excluded_and_listed():
    flags_b = failure_flags(status="diverged", test_acc=math.nan, train_ce=None, classes=10)
    v = compare(
        None, higher_is_better=True, flags_a=[], flags_b=flags_b, name_a="sd", name_b="plain"
    )
    assert v.verdict == "no comparison"
    assert "plain excluded (diverged)" in v.reason
    text = verdict_sentence(v, name_a="sd", name_b="plain", metric="test accuracy")
    assert "better" not in text and "worse" not in text
    assert "plain excluded (diverged)" in text


def test_all_arms_at_chance_make_no_claim():
    # Both arms at 10% on a 10-class problem, yet one is "significantly" higher.
    a = {1: 0.102, 2: 0.103, 3: 0.104}
    b = {1: 0.098, 2: 0.097, 3: 0.099}
    fa = failure_flags(status="complete", test_acc=0.103, train_ce=2.30, classes=10)
    fb = failure_flags(status="complete", test_acc=0.098, train_ce=2.31, classes=10)
    diff = paired_difference(a, b)
    assert diff.low > 0
    v = compare(diff, higher_is_better=True, flags_a=fa, flags_b=fb, name_a="a", name_b="b")
    assert v.verdict == "no comparison"
    assert "a excluded (at_chance)" in v.reason and "b excluded (at_chance)" in v.reason


def test_better_sentence_states_interval_and_not_fitting_caveat():
    diff = paired_difference({1: 0.5, 2: 0.52, 3: 0.51}, {1: 0.4, 2: 0.41, 3: 0.43})
    v = compare(diff, higher_is_better=True, flags_a=["not_fitting"], flags_b=[], name_a="a")
    text = verdict_sentence(v, name_a="a", name_b="b", metric="test accuracy")
    assert v.verdict == "better"
    assert "95% paired t interval [" in text and "n=3" in text
    assert "caveat: a not fitting" in text


def test_compare_without_interval_for_valid_arms_is_refused():
    with pytest.raises(FathomError, match="paired_difference"):
        compare(None, higher_is_better=True, flags_a=[], flags_b=[])


def test_selected_vs_final_disagreement_is_shown():
    selected = {"plain": 0.981, "sd-constant": 0.983, "residual": 0.980}
    final = {"plain": 0.984, "sd-constant": 0.982, "residual": 0.983}
    r = rank_disagreement(selected, final)
    assert r.disagree
    assert r.selected_order == ["sd-constant", "plain", "residual"]
    assert r.final_order == ["plain", "residual", "sd-constant"]
    row = next(x for x in r.rows if x["name"] == "sd-constant")
    assert (row["selected_rank"], row["final_rank"]) == (1, 3)
    assert not rank_disagreement(selected, selected).disagree
    # lower-is-better (CE) reverses the order
    assert rank_disagreement(
        {"a": 0.1, "b": 0.2}, {"a": 0.1, "b": 0.2}, higher_is_better=False
    ).selected_order == ["a", "b"]
    with pytest.raises(FathomError, match="arms differ"):
        rank_disagreement({"a": 1.0}, {"b": 1.0})


def test_first_crossing_first_observed_time():
    times = [0.0, 10.0, 20.0, 30.0]
    assert first_crossing(times, [0.1, None, 0.97, 0.99], 0.97) == 20.0
    assert first_crossing(times, [0.1, 0.5, 0.6, 0.7], 0.97) is None
    with pytest.raises(FathomError, match="one time per value"):
        first_crossing([0.0], [0.1, 0.2], 0.5)
    with pytest.raises(FathomError, match="decrease"):
        first_crossing([1.0, 0.0], [0.1, 0.2], 0.5)


# ---- depth scaling -------------------------------------------------------------------

LOG_DEPTHS = [4, 8, 12, 16, 20]
LOG_VANILLA = [0.614, 0.522, 0.102, 0.037, 0.010]
LOG_LYAPUNOV = [0.010, 0.010, 0.010, 0.010, 0.010]


def _one_seed(acc):
    return ArmRuns(test_acc=[acc], status=["complete"])


def test_depth_scaling_log_table_gives_no_conclusion():
    """The final table of seed log 000: CIFAR-100, one seed, regularized arm at 1% everywhere."""
    table = DepthScalingTable(
        classes=100,
        baseline="vanilla",
        candidate="Lyapunov",
        dataset="cifar100",
        rows={
            d: {"vanilla": _one_seed(v), "Lyapunov": _one_seed(ly)}
            for d, v, ly in zip(LOG_DEPTHS, LOG_VANILLA, LOG_LYAPUNOV)
        },
    )
    v = depth_scaling_verdict(table)
    assert v.verdict == "no conclusion"
    assert v.sentence == "no conclusion: the Lyapunov arm failed to train at every depth"
    assert "better" not in v.sentence
    assert v.scaling is None
    assert all(v.cells[d]["Lyapunov"] == "failed" for d in LOG_DEPTHS)
    assert [d for d in LOG_DEPTHS if v.cells[d]["vanilla"] == "trained"] == [4, 8, 12, 16]
    assert v.cells[20]["vanilla"] == "failed"
    assert {(f.depth, f.arm) for f in v.excluded} == {(d, "Lyapunov") for d in LOG_DEPTHS} | {
        (20, "vanilla")
    }
    assert all(p.verdict == "no comparison" for p in v.per_depth.values())


def _arm(accs, seeds=(1, 2, 3), status=None, ce=None):
    return ArmRuns(
        test_acc=list(accs),
        status=list(status or ["complete"] * len(accs)),
        train_ce=ce,
        seeds=list(seeds),
    )


def test_depth_scaling_both_arms_train_gives_a_real_comparison():
    # The candidate loses ~0.05 from depth 4 to 12, the baseline ~0.30.
    rows = {
        4: {"base": _arm([0.60, 0.61, 0.62]), "cand": _arm([0.58, 0.59, 0.60])},
        8: {"base": _arm([0.50, 0.52, 0.51]), "cand": _arm([0.57, 0.56, 0.58])},
        12: {"base": _arm([0.30, 0.32, 0.31]), "cand": _arm([0.53, 0.54, 0.56])},
    }
    v = depth_scaling_verdict(DepthScalingTable(100, "base", "cand", rows))
    assert v.verdict == "better scaling"
    assert v.sentence.startswith(
        "better scaling: the cand arm scales better than base from depth 4 to 12"
    )
    assert v.depth_range == (4, 12)
    ref = paired_difference(
        {s: c12 - c4 for s, c4, c12 in zip((1, 2, 3), (0.58, 0.59, 0.60), (0.53, 0.54, 0.56))},
        {s: b12 - b4 for s, b4, b12 in zip((1, 2, 3), (0.60, 0.61, 0.62), (0.30, 0.32, 0.31))},
    )
    assert v.scaling == ref
    assert v.per_depth[4].verdict == "worse"
    assert v.per_depth[12].verdict == "better"
    assert v.to_dict()["cells"]["4"] == {"base": "trained", "cand": "trained"}


def test_depth_scaling_one_seed_is_inconclusive():
    rows = {
        4: {"base": _arm([0.60], seeds=[1]), "cand": _arm([0.58], seeds=[1])},
        12: {"base": _arm([0.30], seeds=[1]), "cand": _arm([0.55], seeds=[1])},
    }
    v = depth_scaling_verdict(DepthScalingTable(100, "base", "cand", rows))
    assert v.verdict == "inconclusive"
    assert "at least 2 seeds" in v.sentence
    assert v.scaling is not None and v.scaling.low is None


def test_depth_scaling_claims_only_from_depths_where_both_trained():
    # Baseline diverges at 16 on one seed, at chance by CE at 20: the claim uses 4..12.
    ln100 = math.log(100)
    rows = {
        4: {"base": _arm([0.60, 0.61, 0.62]), "cand": _arm([0.60, 0.61, 0.62])},
        12: {"base": _arm([0.50, 0.52, 0.51]), "cand": _arm([0.51, 0.50, 0.52])},
        16: {
            "base": _arm([0.4, math.nan, 0.4], status=["complete", "diverged", "complete"]),
            "cand": _arm([0.5, 0.5, 0.5]),
        },
        20: {"base": _arm([0.3, 0.3, 0.3], ce=[ln100] * 3), "cand": _arm([0.5, 0.5, 0.5])},
    }
    v = depth_scaling_verdict(DepthScalingTable(100, "base", "cand", rows))
    assert v.depth_range == (4, 12)
    assert v.cells[16]["base"] == "partial" and v.cells[20]["base"] == "failed"
    assert v.verdict == "not established"
    assert "only cand trained at depth(s) [20]" in v.observations
    assert (16, "base", 2) in {(f.depth, f.arm, f.seed) for f in v.excluded}


def test_depth_scaling_single_common_depth_is_inconclusive():
    rows = {
        4: {"base": _arm([0.6, 0.6, 0.6]), "cand": _arm([0.6, 0.6, 0.6])},
        8: {"base": _arm([0.01, 0.01, 0.01]), "cand": _arm([0.5, 0.5, 0.5])},
    }
    v = depth_scaling_verdict(DepthScalingTable(100, "base", "cand", rows))
    assert v.verdict == "inconclusive"
    assert "at least two depths" in v.sentence


def test_depth_scaling_bad_tables():
    with pytest.raises(FathomError, match="lacks arm"):
        depth_scaling_verdict(DepthScalingTable(10, "a", "b", {4: {"a": _arm([0.5])}}))
    with pytest.raises(FathomError, match="one entry per seed"):
        depth_scaling_verdict(
            DepthScalingTable(
                10, "a", "b", {4: {"a": _arm([0.5, 0.6]), "b": ArmRuns([0.5, 0.6], ["complete"])}}
            )
        )
    with pytest.raises(FathomError, match="no depths"):
        depth_scaling_verdict(DepthScalingTable(10, "a", "b", {}))


def test_depth_scaling_log_table_with_three_seeds_still_no_conclusion():
    rows = {
        d: {"vanilla": _arm([v, v + 0.01, v - 0.005]), "Lyapunov": _arm([ly, ly, ly])}
        for d, v, ly in zip(LOG_DEPTHS, LOG_VANILLA, LOG_LYAPUNOV)
    }
    v = depth_scaling_verdict(DepthScalingTable(100, "vanilla", "Lyapunov", rows))
    assert v.sentence == "no conclusion: the Lyapunov arm failed to train at every depth"


def test_depth_scaling_both_arms_at_chance():
    rows = {d: {"a": _arm([0.01] * 3), "b": _arm([0.011] * 3)} for d in (4, 8)}
    v = depth_scaling_verdict(DepthScalingTable(100, "a", "b", rows))
    assert v.sentence == "no conclusion: both arms failed to train at every depth"
