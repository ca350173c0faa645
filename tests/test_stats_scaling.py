"""The depth-scaling verdict on adversarial tables, including the seed log that lied."""

import math

import pytest
from scipy import stats as scipy_stats

from fathom.errors import FathomError
from fathom.stats.intervals import paired_difference
from fathom.stats.scaling import ArmRuns, DepthScalingTable, depth_scaling_verdict

LOG_DEPTHS = [4, 8, 12, 16, 20]
LOG_VANILLA = [0.614, 0.522, 0.102, 0.037, 0.010]
LOG_LYAPUNOV = [0.010, 0.010, 0.010, 0.010, 0.010]


def _arm(accs, seeds=None, status=None, ce=None):
    seeds = list(seeds) if seeds is not None else list(range(1, len(accs) + 1))
    return ArmRuns(
        test_acc=list(accs),
        status=list(status or ["complete"] * len(accs)),
        train_ce=ce,
        seeds=seeds,
    )


def _jitter(value, n):
    """n per-seed values around ``value`` (deterministic, spread 0.004)."""
    return [value + 0.002 * ((i % 3) - 1) for i in range(n)]


def _verdict(rows, base="vanilla", cand="Lyapunov", classes=100):
    return depth_scaling_verdict(DepthScalingTable(classes, base, cand, rows))


def _fisher_two_sided(a, b, c, d):
    """Brute-force two-sided Fisher exact p for [[a, b], [c, d]] (hypergeometric sum)."""
    row1, col1, total = a + b, a + c, a + b + c + d

    def prob(x):
        return math.comb(col1, x) * math.comb(total - col1, row1 - x) / math.comb(total, row1)

    p0 = prob(a)
    lo, hi = max(0, row1 + col1 - total), min(row1, col1)
    return math.fsum(prob(x) for x in range(lo, hi + 1) if prob(x) <= p0 * (1 + 1e-9))


# ---- the seed log ---------------------------------------------------------------------


def test_seed_log_table_gives_no_conclusion():
    """The final table of seed log 000: CIFAR-100, one seed, the regularized arm at 1% everywhere."""
    rows = {
        d: {"vanilla": _arm([v]), "Lyapunov": _arm([ly])}
        for d, v, ly in zip(LOG_DEPTHS, LOG_VANILLA, LOG_LYAPUNOV)
    }
    v = _verdict(rows)
    assert v.verdict == "no conclusion"
    assert v.sentence == "no conclusion: the Lyapunov arm failed to train at every depth"
    assert "better" not in v.sentence
    assert v.scaling is None
    assert all(v.cells[d]["Lyapunov"] == "failed" for d in LOG_DEPTHS)
    assert [d for d in LOG_DEPTHS if v.cells[d]["vanilla"] == "trained"] == [4, 8, 12, 16]
    assert {(f.depth, f.arm) for f in v.excluded} == {(d, "Lyapunov") for d in LOG_DEPTHS} | {
        (20, "vanilla")
    }
    assert all(p.verdict == "no comparison" for p in v.per_depth.values())
    assert set(v.excluded_depths) == set(LOG_DEPTHS)


def test_seed_log_table_with_three_seeds_still_no_conclusion():
    rows = {
        d: {"vanilla": _arm([v, v + 0.01, v - 0.005]), "Lyapunov": _arm([ly] * 3)}
        for d, v, ly in zip(LOG_DEPTHS, LOG_VANILLA, LOG_LYAPUNOV)
    }
    assert (
        _verdict(rows).sentence == "no conclusion: the Lyapunov arm failed to train at every depth"
    )


# ---- the issue's false claim ----------------------------------------------------------


def _issue_table(n):
    """Candidate trains at 4 and 8 (worse than vanilla at both, but losing less from 4 to 8),
    then sits at chance at 12, 16, 20; vanilla still trains at 12 and 16."""
    return {
        4: {"vanilla": _arm(_jitter(0.60, n)), "Lyapunov": _arm(_jitter(0.55, n))},
        8: {"vanilla": _arm(_jitter(0.50, n)), "Lyapunov": _arm(_jitter(0.48, n))},
        12: {"vanilla": _arm(_jitter(0.30, n)), "Lyapunov": _arm([0.010] * n)},
        16: {"vanilla": _arm(_jitter(0.10, n)), "Lyapunov": _arm([0.010] * n)},
        20: {"vanilla": _arm([0.010] * n), "Lyapunov": _arm([0.010] * n)},
    }


def test_candidate_failing_only_at_deeper_depths_is_never_better_scaling():
    v = _verdict(_issue_table(3))
    # the old rule compared depths 4 and 8 only and printed "better scaling"
    assert v.scaling is not None and v.scaling.low > 0
    assert v.depth_range == (4, 8)
    assert v.verdict == "inconclusive"
    assert "better scaling" not in v.sentence and "scales better" not in v.sentence
    assert "failures point the other way" in v.sentence
    assert "depth 12 (Lyapunov failed on 3/3 seeds, vanilla trained on 3/3" in v.sentence
    assert set(v.excluded_depths) == {12, 16, 20}
    assert v.excluded_depths[20].startswith("Lyapunov failed on 3/3 seeds (at_chance 3/3)")
    assert "vanilla failed on 3/3 seeds" in v.excluded_depths[20]
    assert "Lyapunov is worse than vanilla at every depth from 4 to 8" in v.sentence
    against = [e for e in v.evidence if e.direction == "against"]
    assert [e.depth for e in against] == [12, 16]
    assert all(not e.decisive for e in against)
    assert against[0].p_value == pytest.approx(_fisher_two_sided(3, 0, 0, 3))


def test_candidate_failing_where_baseline_trains_on_five_seeds_is_worse_scaling():
    v = _verdict(_issue_table(5))
    assert v.verdict == "worse scaling"
    assert v.sentence.startswith(
        "worse scaling: the Lyapunov arm fails to train where vanilla trains, at depth 12"
    )
    assert "depth 16 (Lyapunov failed on 5/5 seeds" in v.sentence
    assert all(e.decisive for e in v.evidence)
    assert v.evidence[0].p_value == pytest.approx(_fisher_two_sided(5, 0, 0, 5))
    assert v.evidence[0].p_value == pytest.approx(2 / math.comb(10, 5))


# ---- other adversarial tables ---------------------------------------------------------


def test_both_arms_partly_at_chance_claims_only_the_shallow_range():
    rows = {
        4: {"b": _arm([0.60, 0.61, 0.62]), "c": _arm([0.60, 0.61, 0.61])},
        8: {"b": _arm([0.50, 0.52, 0.51]), "c": _arm([0.57, 0.58, 0.59])},
        12: {"b": _arm([0.30, 0.31, 0.33]), "c": _arm([0.55, 0.55, 0.56])},
        16: {"b": _arm([0.01, 0.30, 0.01]), "c": _arm([0.01, 0.52, 0.50])},
        20: {"b": _arm([0.01, 0.01, 0.01]), "c": _arm([0.01, 0.01, 0.01])},
    }
    v = _verdict(rows, "b", "c")
    assert v.cells[16] == {"b": "partial", "c": "partial"}
    assert v.depth_range == (4, 12)
    assert v.verdict == "better scaling"
    assert v.sentence.startswith(
        "better scaling: the c arm scales better than b from depth 4 to 12"
    )
    assert "depth 16: c failed on 1/3 seeds (at_chance 1/3); b failed on 2/3 seeds" in v.sentence
    assert "depth 20: c failed on 3/3 seeds" in v.sentence
    assert v.evidence == []
    ref = paired_difference(
        {s: c12 - c4 for s, c4, c12 in zip((1, 2, 3), (0.60, 0.61, 0.61), (0.55, 0.55, 0.56))},
        {s: b12 - b4 for s, b4, b12 in zip((1, 2, 3), (0.60, 0.61, 0.62), (0.30, 0.31, 0.33))},
    )
    assert v.scaling == ref


def test_failure_at_an_interior_depth_stops_the_range():
    # The candidate diverges on one seed at depth 8, then trains and (apparently) scales well.
    rows = {
        4: {"b": _arm([0.60, 0.61, 0.62]), "c": _arm([0.60, 0.61, 0.62])},
        8: {
            "b": _arm([0.50, 0.52, 0.51]),
            "c": _arm([0.58, math.nan, 0.59], status=["complete", "diverged", "complete"]),
        },
        12: {"b": _arm([0.30, 0.32, 0.31]), "c": _arm([0.56, 0.57, 0.58])},
        16: {"b": _arm([0.20, 0.22, 0.21]), "c": _arm([0.55, 0.56, 0.57])},
    }
    v = _verdict(rows, "b", "c")
    assert v.verdict == "inconclusive"
    assert v.depth_range is None and v.scaling is None
    assert "better" not in v.sentence
    assert v.excluded_depths[8] == "c failed on 1/3 seeds (diverged 1/3); b trained (3/3 seeds)"
    assert v.excluded_depths[12].startswith(
        "both trained, but beyond depth 8 where the range stops"
    )
    assert "evidence against c, not decisive: depth 8" in v.sentence
    assert (8, "c", 2) in {(f.depth, f.arm, f.seed) for f in v.excluded}


def test_baseline_failure_at_an_interior_depth_stops_the_range_too():
    rows = {
        4: {"b": _arm([0.60, 0.61, 0.62]), "c": _arm([0.60, 0.61, 0.62])},
        8: {"b": _arm([0.50, 0.50, 0.50]), "c": _arm([0.55, 0.56, 0.57])},
        12: {"b": _arm([0.01, 0.32, 0.31]), "c": _arm([0.50, 0.51, 0.52])},
        16: {"b": _arm([0.30, 0.32, 0.31]), "c": _arm([0.50, 0.51, 0.52])},
    }
    v = _verdict(rows, "b", "c")
    assert v.depth_range == (4, 8)
    assert v.verdict == "better scaling"
    assert "depth 16: both trained, but beyond depth 12" in v.sentence
    assert [(e.depth, e.direction) for e in v.evidence] == [(12, "for")]


def test_genuine_improvement_at_every_depth_is_reported():
    depths = [4, 8, 12, 16, 20]
    base = {d: [0.62 - 0.03 * i + 0.004 * s for s in range(3)] for i, d in enumerate(depths)}
    cand = {d: [0.63 - 0.005 * i + 0.003 * s for s in range(3)] for i, d in enumerate(depths)}
    rows = {d: {"b": _arm(base[d]), "c": _arm(cand[d])} for d in depths}
    v = _verdict(rows, "b", "c")
    assert v.verdict == "better scaling"
    assert v.depth_range == (4, 20)
    assert v.excluded_depths == {} and v.evidence == []
    assert "c is better than b at every depth from 4 to 20 (paired intervals)" in v.sentence
    # the interval against a brute-force float64 paired t interval
    deltas = [(cand[20][s] - cand[4][s]) - (base[20][s] - base[4][s]) for s in range(3)]
    mean = math.fsum(deltas) / 3
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in deltas) / 2)
    half = scipy_stats.t.ppf(0.975, 2) * sd / math.sqrt(3)
    assert v.scaling.estimate == pytest.approx(mean, abs=1e-12)
    assert (v.scaling.low, v.scaling.high) == pytest.approx((mean - half, mean + half), abs=1e-12)
    assert all(v.per_depth[d].verdict == "better" for d in depths)


def test_diverged_baseline_on_every_seed_is_decisive_evidence_for_the_candidate():
    n = 5
    rows = {
        4: {"b": _arm(_jitter(0.60, n)), "c": _arm(_jitter(0.60, n))},
        8: {"b": _arm(_jitter(0.50, n)), "c": _arm(_jitter(0.50, n))},
        12: {"b": _arm([math.nan] * n, status=["diverged"] * n), "c": _arm(_jitter(0.45, n))},
    }
    v = _verdict(rows, "b", "c")
    assert v.verdict == "better scaling"
    assert v.sentence.startswith(
        "better scaling: the b arm fails to train where c trains, at depth 12"
    )
    assert v.excluded_depths[12] == "c trained (5/5 seeds); b failed on 5/5 seeds (diverged 5/5)"
    assert v.cells[12]["b"] == "failed"


def test_conflicting_decisive_failures_are_inconclusive():
    n = 5
    rows = {
        4: {"b": _arm(_jitter(0.60, n)), "c": _arm(_jitter(0.60, n))},
        8: {"b": _arm(_jitter(0.50, n)), "c": _arm([0.01] * n)},
        12: {"b": _arm([0.01] * n), "c": _arm(_jitter(0.45, n))},
    }
    v = _verdict(rows, "b", "c")
    assert v.verdict == "inconclusive"
    assert v.sentence.startswith("inconclusive: conflicting failures at depth 8")


def test_one_seed_gives_no_interval_based_claim():
    rows = {
        4: {"b": _arm([0.60]), "c": _arm([0.58])},
        12: {"b": _arm([0.30]), "c": _arm([0.55])},
    }
    v = _verdict(rows, "b", "c")
    assert v.verdict == "inconclusive"
    assert "at least 2 seeds" in v.sentence
    assert v.scaling is not None and v.scaling.low is None


def test_one_seed_failing_deeper_is_no_claim_either():
    v = _verdict(_issue_table(1))
    assert v.verdict == "inconclusive"
    assert all(e.p_value == pytest.approx(1.0) and not e.decisive for e in v.evidence)
    assert "better scaling" not in v.sentence and "worse scaling" not in v.sentence


def test_at_chance_by_cross_entropy_and_partial_cells():
    # Baseline diverges at 16 on one seed and is at chance by CE at 20: the interval uses 4..12.
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
    v = _verdict(rows, "base", "cand")
    assert v.depth_range == (4, 12)
    assert v.cells[16]["base"] == "partial" and v.cells[20]["base"] == "failed"
    assert v.verdict == "not established"
    assert "evidence for cand, not decisive: depth 16" in v.sentence
    assert "only cand trained at depth(s) [20]" in v.observations
    assert (16, "base", 2) in {(f.depth, f.arm, f.seed) for f in v.excluded}


def test_single_common_depth_is_inconclusive():
    rows = {
        4: {"base": _arm([0.6, 0.6, 0.6]), "cand": _arm([0.6, 0.6, 0.6])},
        8: {"base": _arm([0.01, 0.01, 0.01]), "cand": _arm([0.5, 0.5, 0.5])},
    }
    v = _verdict(rows, "base", "cand")
    assert v.verdict == "inconclusive"
    assert "at least two depths" in v.sentence


def test_both_arms_at_chance():
    rows = {d: {"a": _arm([0.01] * 3), "b": _arm([0.011] * 3)} for d in (4, 8)}
    v = _verdict(rows, "a", "b")
    assert v.sentence == "no conclusion: both arms failed to train at every depth"


def test_to_dict_is_json_ready():
    v = _verdict(_issue_table(3))
    d = v.to_dict()
    assert d["depth_range"] == [4, 8]
    assert set(d["excluded_depths"]) == {"12", "16", "20"}
    assert d["evidence"][0]["depth"] == 12 and d["evidence"][0]["direction"] == "against"


def test_bad_tables():
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
    with pytest.raises(FathomError, match="both 'a'"):
        depth_scaling_verdict(DepthScalingTable(10, "a", "a", {4: {"a": _arm([0.5])}}))
