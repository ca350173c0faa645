"""Rule 7 of :mod:`fathom.stats.scaling`: the two answers (level, scaling) from their judged
comparisons, and an answer under two readings of the undetermined runs. The claim checker
(:mod:`fathom.stats.claims`) re-derives every answer with these functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from fathom.stats.results import Comparison, Decision, Results
from fathom.stats.scaling_table import FailureEvidence
from fathom.stats.verdicts import OPPOSITE, DecisionVerdict, LevelVerdict, TrendVerdict

_LEVEL: dict[str, LevelVerdict] = {
    "better": "better across depths",
    "worse": "worse across depths",
    "equivalent": "equivalent across depths",
}
_TREND: dict[str, TrendVerdict] = {
    "better": "scales better",
    "worse": "scales worse",
    "equivalent": "scales equivalently",
}
_ESTABLISHED = (*_LEVEL.values(), *_TREND.values())
SCALES_BETTER = _TREND["better"]
"""The candidate's difference to the baseline grows with depth (change and slope agree)."""

LEVEL_RULE = "depth scaling level"
TREND_RULE = "depth scaling trend"
BOTH_WAYS_RULE = "depth scaling, undetermined runs read both ways"


def adverse(
    verdict: str, per_depth: dict[int, Comparison], evidence: list[FailureEvidence]
) -> tuple[list[Comparison], list[FailureEvidence]]:
    """Established per-depth comparisons and decisive evidence contradicting ``verdict``."""
    if verdict == "equivalent":
        comps = [c for c in per_depth.values() if c.verdict in OPPOSITE]
        return comps, [e for e in evidence if e.decisive]
    if verdict not in OPPOSITE:
        return [], []
    comps = [c for c in per_depth.values() if c.verdict == OPPOSITE[verdict]]
    wrong = "against" if verdict == "better" else "for"
    return comps, [e for e in evidence if e.decisive and e.direction == wrong]


def level_verdict(
    level: Comparison, per_depth: dict[int, Comparison], evidence: list[FailureEvidence]
) -> LevelVerdict:
    """The level: the level contrast's verdict unless contradicted (then inconclusive)."""
    if level.verdict not in _LEVEL:
        return "not established"
    comps, ev = adverse(level.verdict, per_depth, evidence)
    return "inconclusive" if comps or ev else _LEVEL[level.verdict]


def trend_verdict(change: Comparison, slope: Comparison) -> TrendVerdict:
    """The scaling: the change and the slope agreeing; both established and differing is
    inconclusive; anything else not established."""
    if change.verdict == slope.verdict and change.verdict in _TREND:
        return _TREND[change.verdict]
    if change.verdict in _TREND and slope.verdict in _TREND:
        return "inconclusive"
    return "not established"


def both_ways(verdicts: Sequence[DecisionVerdict], readings: int = 2) -> DecisionVerdict:
    """An answer under every reading of the undetermined runs: the common verdict when all
    ``readings`` gave the same one, else not established."""
    if len(verdicts) == readings and len(set(verdicts)) == 1:
        return verdicts[0]
    return "not established"


def is_fragile(verdict: str, contrasts: Sequence[Comparison]) -> bool:
    """An established answer one seed carries (a contrast it rests on is fragile)."""
    return verdict in _ESTABLISHED and any(c.fragile for c in contrasts)


# ---- re-derivation from a decision's record (the claim checker's rows) ----------------------


def rederive_level(d: Decision, results: Results) -> tuple[str, bool]:
    """A level decision's ``(verdict, fragile)`` from its profile contrast, its per-depth
    comparisons and its failure evidence."""
    profile = results.comparison(d.profile)
    per_depth = {i: results.comparison(cid) for i, cid in enumerate(d.per_depth)}
    evidence = [
        FailureEvidence(**{**e, "failed": tuple(e["failed"]), "other": tuple(e["other"])})
        for e in d.evidence
    ]
    verdict = level_verdict(profile, per_depth, evidence)
    return verdict, is_fragile(verdict, [profile])


def rederive_trend(d: Decision, results: Results) -> tuple[str, bool]:
    """A scaling decision's ``(verdict, fragile)`` from its change and slope contrasts."""
    change, slope = (results.comparison(cid) for cid in d.inputs)
    verdict = trend_verdict(change, slope)
    return verdict, is_fragile(verdict, [change, slope])


def rederive_both_ways(d: Decision, results: Results) -> tuple[str, bool]:
    """An answer under both readings from the two decisions it combines: fragile when
    established and either reading is."""
    parts = [next(x for x in results.decisions if x.id == cid) for cid in d.inputs]
    verdict = both_ways([x.verdict for x in parts])
    return verdict, verdict != "not established" and any(x.fragile for x in parts)
