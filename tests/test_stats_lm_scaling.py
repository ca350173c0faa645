"""The language model's depth-scaling rule (LayerDrop against dense in nats/token, level and
trend apart) and its row of the claim checker: every answer is re-derived from the recorded
per-run nats/token, a record or a verdict changed after the fact is flagged, and a constant
offset across depths never scales better or worse, through the registry as well."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.errors import FathomError
from fathom.stats.claims import DECISION_RULES, check, decision_rule
from fathom.stats.lm_scaling import LM_RULE, LMRunRecord, lm_depth_verdict
from fathom.stats.results import Decision, Results

UNIGRAM = 3.0
ARMS = ("dense", "LayerDrop")


def _records(table: dict[tuple[int, str, int], float], failed=()) -> list[LMRunRecord]:
    return [
        LMRunRecord(d, arm, s, "diverged" if (d, arm, s) in failed else "complete", ce, UNIGRAM)
        for (d, arm, s), ce in table.items()
    ]


def _tables():
    """A LayerDrop advantage growing with depth, and a constant one (jittered per seed)."""
    depths, seeds = (2, 4, 6, 8), (0, 1, 2, 3)
    grow, level = {}, {}
    for d in depths:
        for s in seeds:
            jitter = 0.001 * ((s * 7 + d) % 3)
            grow[(d, "dense", s)] = 2.0
            grow[(d, "LayerDrop", s)] = 2.0 - 0.05 * d + jitter
            level[(d, "dense", s)] = 2.0
            level[(d, "LayerDrop", s)] = 1.8 + jitter
    return grow, level


def _decision(results: Results, did: str) -> Decision:
    return next(d for d in results.decisions if d.id == did)


def _with_decision(results: Results, new: Decision) -> Results:
    decisions = [new if d.id == new.id else d for d in results.decisions]
    return results.model_copy(update={"decisions": decisions})


def _tampered(results: Results, did: str, change) -> Results:
    """``results`` with decision ``did``'s recorded runs passed through ``change``."""
    d = _decision(results, did)
    runs = [change(dict(r)) for r in d.records["runs"]]
    return _with_decision(results, d.model_copy(update={"records": {**d.records, "runs": runs}}))


def test_the_rule_has_one_row_and_every_decision_names_it():
    grow, _ = _tables()
    v = lm_depth_verdict(_records(grow), ARMS)
    assert {d.rule for d in v.results.decisions} == {LM_RULE}
    assert decision_rule(LM_RULE) is DECISION_RULES[LM_RULE]
    assert [d.id for d in v.results.decisions] == ["level", "trend"]


def test_the_checker_rederives_an_agreeing_verdict_from_the_records():
    grow, level = _tables()
    for table, want in ((grow, "scales better"), (level, "scales equivalently")):
        v = lm_depth_verdict(_records(table), ARMS)
        assert v.trend == want and v.level == "better across depths"
        assert check(v.results) == []
        row = DECISION_RULES[LM_RULE]
        for d in v.results.decisions:
            assert row.rederive(d, v.results) == (d.verdict, d.fragile)
        # through JSON, as table.json holds it
        again = Results.model_validate(json.loads(json.dumps(v.to_dict()["results"])))
        assert check(again) == []


def test_a_tampered_record_is_flagged_as_a_mismatch():
    grow, _ = _tables()
    v = lm_depth_verdict(_records(grow), ARMS)
    assert v.trend == "scales better"

    def flatten(r):  # LayerDrop's advantage made constant: no longer scales better
        if r["arm"] == "LayerDrop":
            r["ce"] = 2.0 - 0.2 + 0.001 * r["seed"]
        return r

    problems = check(_tampered(v.results, "trend", flatten))
    assert any(p.startswith("decision trend: 'scales better', re-derived") for p in problems)
    # a small change that keeps the verdict still changes the numbers the sentence prints
    deep = max(r.depth for r in _records(grow))

    def nudge(r):
        if r["arm"] == "LayerDrop" and r["depth"] == deep and r["seed"] == 0:
            r["ce"] -= 0.01
        return r

    problems = check(_tampered(v.results, "trend", nudge))
    assert problems and all("decision trend: the sentence does not print" in p for p in problems)


def test_a_contradicted_verdict_is_flagged():
    grow, _ = _tables()
    v = lm_depth_verdict(_records(grow), ARMS)
    lied = _with_decision(v.results, _decision(v.results, "level").model_copy(
        update={"verdict": "worse across depths"}))  # fmt: skip
    assert "decision level: 'worse across depths', re-derived 'better across depths'" in check(lied)


def test_unreadable_records_and_unknown_questions_are_refused_naming_the_fix():
    grow, _ = _tables()
    v = lm_depth_verdict(_records(grow), ARMS)
    d = _decision(v.results, "level")
    with pytest.raises(FathomError, match="unreadable records"):
        DECISION_RULES[LM_RULE].rederive(d.model_copy(update={"records": {}}), v.results)
    with pytest.raises(FathomError, match="answers no question"):
        DECISION_RULES[LM_RULE].rederive(d.model_copy(update={"id": "depth"}), v.results)


def test_the_contrasts_match_a_float64_reference():
    grow, _ = _tables()
    v = lm_depth_verdict(_records(grow), ARMS)
    depths, seeds = np.array([2, 4, 6, 8], float), range(4)
    g = np.array([[grow[(d, "LayerDrop", s)] - grow[(d, "dense", s)] for d in (2, 4, 6, 8)]
                  for s in seeds], dtype=np.float64)  # fmt: skip
    by = {c.id: c for c in v.comparisons}
    assert by["level"].estimate == pytest.approx(g.mean(axis=1).mean(), abs=1e-12)
    assert by["change"].estimate == pytest.approx((g[:, -1] - g[:, 0]).mean(), abs=1e-12)
    slopes = [np.polyfit(depths, g[s], 1)[0] for s in seeds]
    assert by["slope"].estimate == pytest.approx(float(np.mean(slopes)), abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    st.floats(-0.5, 0.5),
    st.lists(st.floats(-0.05, 0.05), min_size=3, max_size=3),
    st.lists(st.floats(2.0, 2.5), min_size=4, max_size=4),
)
@example(0.0, [0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0])
def test_a_constant_advantage_never_scales_better_or_worse(offset, seed_noise, base):
    """LayerDrop = dense + a constant (per seed): the level may differ, the trend cannot, and
    the claim checker's row, recomputing from the records, says the same."""
    depths = (2, 4, 6, 8)
    table = {}
    for i, d in enumerate(depths):
        for s, n in enumerate(seed_noise):
            table[(d, "dense", s)] = base[i] + 0.01 * s
            table[(d, "LayerDrop", s)] = base[i] + 0.01 * s + offset + n
    v = lm_depth_verdict(_records(table), ARMS)
    assert v.trend not in ("scales better", "scales worse")
    trend = _decision(v.results, "trend")
    again, _ = decision_rule(trend.rule).rederive(trend, v.results)
    assert again == v.trend and again not in ("scales better", "scales worse")
    assert check(v.results) == []


def test_a_level_alone_does_not_scale_better():
    _, level = _tables()
    flat = lm_depth_verdict(_records(level), ARMS)
    assert flat.level == "better across depths" and flat.trend == "scales equivalently"
    assert any(line.startswith("scaling") for line in flat.lines)


def test_failures_enter_at_the_unigram_baseline_and_an_arm_that_always_fails_concludes_nothing():
    depths, seeds = (2, 4), (0, 1)
    table = {(d, a, s): 2.0 for d in depths for a in ARMS for s in seeds}
    allfail = {(d, "LayerDrop", s) for d in depths for s in seeds}
    v = lm_depth_verdict(_records(table, failed=allfail), ARMS)
    assert v.level == v.trend == "no conclusion"
    assert check(v.results) == []
    worse = {**table, (2, "LayerDrop", 0): UNIGRAM + 1}  # no better than the baseline: failed
    rec = _records(worse)
    assert next(r for r in rec if r.ce == UNIGRAM + 1).failed
    missing = lm_depth_verdict(_records({k: x for k, x in table.items() if k != (4, "dense", 1)}), ARMS)  # fmt: skip
    assert missing.level == "no comparison" and "dense at depth 4" in missing.lines[0]
    assert check(missing.results) == []
    # the records restored: the checker re-derives a comparison, so "no comparison" is flagged
    full = [
        {"depth": d, "arm": a, "seed": s, "status": "complete", "ce": 2.0, "unigram_ce": UNIGRAM,
         "selected_epoch": None, "run_dir": None}
        for d in depths for a in ARMS for s in seeds
    ]  # fmt: skip
    restored = missing.results.model_copy(
        update={
            "decisions": [
                d.model_copy(update={"records": {**d.records, "runs": full}})
                for d in missing.results.decisions
            ]
        }
    )
    problems = check(restored)
    assert any(p.startswith("decision level: 'no comparison', re-derived") for p in problems)


def test_a_failed_run_enters_at_the_baseline_value():
    """A diverged LayerDrop run at the deepest depth enters at the unigram baseline: the
    per-depth estimate is the paired mean with that run at ``UNIGRAM``."""
    depths, seeds = (2, 4), (0, 1, 2)
    table = {(d, a, s): 2.0 + 0.01 * s for d in depths for a in ARMS for s in seeds}
    v = lm_depth_verdict(_records(table, failed={(4, "LayerDrop", 0)}), ARMS)
    d4 = next(c for c in v.comparisons if c.id == "depth 4")
    assert d4.estimate == pytest.approx((UNIGRAM - 2.0) / 3, abs=1e-12)
    assert math.isfinite(d4.estimate) and check(v.results) == []
