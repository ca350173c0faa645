"""Rule 6 of :mod:`fathom.stats.scaling` in words: the profile contrast, the per-depth
comparisons and the failure evidence combined into one verdict, its sentence and its
typed results; and the factual notes on where each arm trained. The rules are stated in
that module's docstring.
"""

from __future__ import annotations

from dataclasses import asdict

from fathom.stats.results import OPPOSITE, Claim, Comparison, Decision, Results, Sentence
from fathom.stats.scaling_table import DepthScalingTable, FailureEvidence
from fathom.stats.sentences import (
    comparison_sentence,
    comparison_text,
    family_note,
    verdict_words,
)

SCALING = {"better": "better scaling", "worse": "worse scaling", "equivalent": "equivalent scaling"}
BETTER_SCALING = SCALING["better"]


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


def scaling_verdict(
    profile: Comparison, per_depth: dict[int, Comparison], evidence: list[FailureEvidence]
) -> str:
    """The combination rule (rule 6): one verdict word from the judged comparisons."""
    if profile.verdict not in SCALING:
        return "not established"
    comps, ev = adverse(profile.verdict, per_depth, evidence)
    return "inconclusive" if comps or ev else SCALING[profile.verdict]


def evidence_text(table: DepthScalingTable, ev: list[FailureEvidence]) -> str:
    """``depth 12 (Lyapunov failed on 5/5 seeds, vanilla on 0/5; Fisher exact p=0.0079)``."""
    parts = []
    for e in ev:
        other = table.baseline if e.failing_arm == table.candidate else table.candidate
        parts.append(
            f"depth {e.depth} ({e.failing_arm} failed on {e.failed[0]}/{e.failed[1]} seeds, "
            f"{other} on {e.other[0]}/{e.other[1]}; Fisher exact p={e.p_value:.2g}"
            f"{', decisive under Holm' if e.decisive else ''})"
        )
    return ", ".join(parts)


def _per_depth_text(per_depth: dict[int, Comparison]) -> str:
    groups: dict[str, list[int]] = {}
    for d, c in per_depth.items():
        groups.setdefault(c.verdict, []).append(d)
    return "; ".join(f"{w} at depth(s) {ds}" for w, ds in groups.items())


def combine(
    table: DepthScalingTable,
    profile: Comparison,
    per_depth: dict[int, Comparison],
    evidence: list[FailureEvidence],
    excluded_depths: dict[int, str],
) -> tuple[str, str, Results]:
    """Rule 6: the verdict, its sentence and the typed results it is checked against."""
    cand, base = table.candidate, table.baseline
    verdict = scaling_verdict(profile, per_depth, evidence)
    comps, ev = adverse(profile.verdict, per_depth, evidence)
    head = verdict + (", fragile" if profile.fragile and verdict in SCALING.values() else "")
    body = (
        f"{cand} vs {base} accuracy over the depth profile ({profile.context['scope']}): "
        f"{verdict_words(profile)} ({comparison_text(profile)})"
    )
    parts = [f"{head}: {body}"]
    if comps or ev:
        why = [f"{c.id} is {c.verdict} ({comparison_text(c)})" for c in comps]
        if ev:
            why.append(f"failure evidence at {evidence_text(table, ev)}")
        parts.append("contradicted by " + "; ".join(why))
    parts.append(f"per depth, {cand} vs {base}: {_per_depth_text(per_depth)}")
    shown = [e for e in evidence if e not in ev]
    if shown:
        parts.append(f"failure counts differ at {evidence_text(table, shown)}")
    if excluded_depths:
        listed = "; ".join(f"depth {d}: {why}" for d, why in excluded_depths.items())
        parts.append(f"left out (an undetermined run decides nothing): {listed}")
    parts.append(family_note([profile, *per_depth.values()], profile.nominal_level))
    sentence = "; ".join(parts)
    claims = [Claim(comparison=profile.id, verdict=profile.verdict, fragile=profile.fragile)]
    claims += [
        Claim(comparison=c.id, verdict=c.verdict, fragile=c.fragile, brief=c not in comps)
        for c in per_depth.values()
    ]
    decision = Decision(
        id="scaling",
        rule="depth scaling",
        verdict=verdict,
        fragile=head != verdict,
        profile=profile.id,
        per_depth=[c.id for c in per_depth.values()],
        evidence=[asdict(e) for e in evidence],
    )
    results = Results(
        comparisons=[profile, *per_depth.values()],
        sentences=[
            Sentence(text=sentence, claims=claims, decisions=["scaling"]),
            *(comparison_sentence(c) for c in per_depth.values()),
        ],
        decisions=[decision],
        caveats=[family_note([profile, *per_depth.values()], profile.nominal_level)],
    )
    return verdict, sentence, results


def observations(
    cells: dict[int, dict[str, str]], depths: list[int], arms: tuple[str, str]
) -> list[str]:
    """Factual notes on where each arm trained (no comparison of quality)."""
    notes = []
    for arm in arms:
        for state, what in (
            ("failed", "failed to train at depth(s)"),
            ("partial", "failed on some seeds at depth(s)"),
            ("undetermined", "has runs undetermined against chance at depth(s)"),
        ):
            at = [d for d in depths if cells[d][arm] == state]
            if at:
                notes.append(f"{arm} {what} {at}")
    for arm, other in (arms, arms[::-1]):
        only = [d for d in depths if cells[d][arm] == "trained" and cells[d][other] == "failed"]
        if only:
            notes.append(f"only {arm} trained at depth(s) {only}")
    return notes
