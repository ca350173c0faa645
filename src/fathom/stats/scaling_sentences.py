"""The depth-scaling answers in words (rule 7 of :mod:`fathom.stats.scaling`): the level
and the scaling, each named in its own sentence with the comparisons it rests on, one Holm
family per reading stated beside it, the typed results the claim checker re-derives, and
the factual notes on where each arm trained.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Protocol

from fathom.base.units import fmt_value, percent
from fathom.stats.numbers import fmt_region
from fathom.stats.results import Claim, Comparison, Decision, Results, Sentence
from fathom.stats.scaling_answers import (
    BOTH_WAYS_RULE,
    LEVEL_RULE,
    TREND_RULE,
    adverse,
    both_ways,
    is_fragile,
)
from fathom.stats.scaling_table import (
    DepthScalingTable,
    DepthScalingVerdict,
    FailureEvidence,
    Scenario,
)
from fathom.stats.sentences import (
    comparison_sentence,
    comparison_text,
    family_note,
    verdict_words,
)


class Arms(Protocol):
    """The two arms a sentence names (a :class:`DepthScalingTable`, or any pair)."""

    @property
    def baseline(self) -> str: ...

    @property
    def candidate(self) -> str: ...


def _evidence_text(table: Arms, ev: list[FailureEvidence]) -> str:
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


def _tag(s: Scenario) -> str:
    return f"[undetermined runs {s.reading}] " if s.reading else ""


def _sfx(s: Scenario) -> str:
    return f" [{s.reading}]" if s.reading else ""


def level_sentence(table: Arms, s: Scenario) -> tuple[Sentence, Decision]:
    """The level sentence: the level contrast, what contradicts it, the per-depth verdicts."""
    c = s.level_contrast
    assert c is not None  # a judged scenario has its contrasts
    fragile = is_fragile(s.level, [c])
    comps, ev = adverse(c.verdict, s.per_depth, s.evidence)
    parts = [
        f"{_tag(s)}level ({table.candidate} vs {table.baseline} across the depths): {s.level}{', fragile' if fragile else ''} — {c.quantity.name} "
        f"{c.context['scope']}: {verdict_words(c)} ({comparison_text(c)})"
    ]
    if comps or ev:
        why = [f"{x.id} is {x.verdict} ({comparison_text(x)})" for x in comps]
        if ev:
            why.append(f"failure evidence at {_evidence_text(table, ev)}")
        parts.append("contradicted by " + "; ".join(why))
    parts.append(f"per depth: {_per_depth_text(s.per_depth)}")
    shown = [e for e in s.evidence if e not in ev]
    if shown:
        parts.append(f"failure counts differ at {_evidence_text(table, shown)}")
    claims = [Claim(comparison=c.id, verdict=c.verdict, fragile=c.fragile)]
    claims += [
        Claim(comparison=x.id, verdict=x.verdict, fragile=x.fragile, brief=x not in comps)
        for x in s.per_depth.values()
    ]
    decision = Decision(
        id=f"level{_sfx(s)}",
        rule=LEVEL_RULE,
        verdict=s.level,
        fragile=fragile,
        profile=c.id,
        per_depth=[x.id for x in s.per_depth.values()],
        evidence=[asdict(e) for e in s.evidence],
    )
    return Sentence(text="; ".join(parts), claims=claims, decisions=[decision.id]), decision


def _gloss(table: Arms, s: Scenario) -> str:
    """What the scaling answer means, in words."""
    cand, base = table.candidate, table.baseline
    region = fmt_region(s.change) if s.change is not None else ""
    lo, hi = (s.depths[0], s.depths[-1]) if s.depths else (None, None)
    return {
        "scales better": f"{cand} gains on {base} as depth grows",
        "scales worse": f"{cand} loses ground to {base} as depth grows",
        "scales equivalently": (
            f"the difference changes by less than {region} from depth {lo} to depth {hi}"
        ),
        "not established": "no evidence that the difference changes with depth",
        "inconclusive": "the change and the slope disagree",
    }.get(s.trend, s.reason)


def trend_sentence(table: Arms, s: Scenario) -> tuple[Sentence, Decision]:
    """The scaling sentence: the change and the slope of the difference over depth."""
    ch, sl = s.change, s.slope
    assert ch is not None and sl is not None
    fragile = is_fragile(s.trend, [ch, sl])
    text = (
        f"{_tag(s)}scaling ({table.candidate} vs {table.baseline}, how their difference "
        f"changes with depth): {s.trend}{', fragile' if fragile else ''} "
        f"({_gloss(table, s)}) — {ch.quantity.name} {ch.context['scope']}: "
        f"{verdict_words(ch)} ({comparison_text(ch)}); {sl.quantity.name} "
        f"{sl.context['scope']}: {verdict_words(sl)} ({comparison_text(sl)})"
    )
    claims = [Claim(comparison=x.id, verdict=x.verdict, fragile=x.fragile) for x in (ch, sl)]
    decision = Decision(
        id=f"trend{_sfx(s)}",
        rule=TREND_RULE,
        verdict=s.trend,
        fragile=fragile,
        inputs=[ch.id, sl.id],
    )
    return Sentence(text=text, claims=claims, decisions=[decision.id]), decision


def _combined(what: str, parts: list[Decision]) -> Decision:
    """An answer under both readings (an undetermined run at chance and at its value)."""
    verdict = both_ways([d.verdict for d in parts])
    fragile = verdict != "not established" and any(d.fragile for d in parts)
    inputs = [d.id for d in parts]
    return Decision(id=what, rule=BOTH_WAYS_RULE, verdict=verdict, fragile=fragile, inputs=inputs)


def _notes(
    table: DepthScalingTable, scenarios: list[Scenario], accs: dict[tuple[int, str, int], float]
) -> list[str]:
    """Left-out depths, undetermined runs, scenarios without a comparison, family notes."""
    out = []
    for s in scenarios:
        left = [d for d in table.rows if d not in s.depths]
        if left and not s.reason:
            out.append(
                f"{_tag(s)}left out: depth(s) {sorted(left)} (both arms failed on every seed: "
                "chance against chance; in no family)"
            )
        if s.reason:
            out.append(f"{_tag(s)}no comparison: {s.reason}")
    if accs:
        runs = ", ".join(
            f"{arm} seed {seed} at depth {d} ({fmt_value(percent(v), '%')})"
            for (d, arm, seed), v in sorted(accs.items())
        )
        out.append(
            f"undetermined against chance, so read both ways (at chance and at the value "
            f"measured; an answer stands only where both agree): {runs}"
        )
    for s in scenarios:
        comps = [s.level_contrast, s.change, s.slope, *s.per_depth.values()]
        judged = [c for c in comps if c is not None]
        if judged:
            out.append(f"family {s.family!r}: {family_note(judged, judged[0].nominal_level)}")
    return out


def _results(table: DepthScalingTable, scenarios: list[Scenario]) -> tuple[list, list, list]:
    """Sentences and decisions of every judged reading, and all their comparisons."""
    sentences, decisions, comps = [], [], []
    for s in scenarios:
        if s.reason:
            continue
        for make in (level_sentence, trend_sentence):
            sentence, decision = make(table, s)
            sentences.append(sentence)
            decisions.append(decision)
        comps += [s.level_contrast, s.change, s.slope, *s.per_depth.values()]
    return sentences, decisions, comps


def assemble(
    table: DepthScalingTable,
    scenarios: list[Scenario],
    accs: dict[tuple[int, str, int], float],
    **out: Any,
) -> DepthScalingVerdict:
    """Both answers, their sentences and the typed results (one reading, or two)."""
    sentences, decisions, comps = _results(table, scenarios)
    if len(scenarios) == 1:
        level, trend = decisions
        shown = [level, trend]
    else:
        level = _combined("level", [d for d in decisions if d.rule == LEVEL_RULE])
        trend = _combined("trend", [d for d in decisions if d.rule == TREND_RULE])
        shown = [level, trend, *decisions]
        decisions += [level, trend]
    head = f"level: {level.verdict}{', fragile' if level.fragile else ''}; scaling: {trend.verdict}"
    head += ", fragile" if trend.fragile else ""
    if len(scenarios) == 1:
        head += f" ({_gloss(table, scenarios[0])})"
    else:
        readings = "; ".join(f"{s.reading}: level {s.level}, scaling {s.trend}" for s in scenarios)
        head += f" (undetermined runs read both ways — {readings})"
    notes = _notes(table, scenarios, accs)
    headline = Sentence(text=head, decisions=[d.id for d in shown])
    extra = [Sentence(text=n) for n in notes]
    results = Results(
        comparisons=comps,
        sentences=[headline, *sentences, *extra, *(comparison_sentence(c) for c in comps[3:])],
        decisions=decisions,
        caveats=[n for n in notes if n.startswith("family")],
    )
    lines = [head, *(x.text for x in sentences), *notes]
    return DepthScalingVerdict(
        "judged",
        " ".join(line.rstrip(".") + "." for line in lines),
        level=level.verdict,
        trend=trend.verdict,
        headline=head,
        lines=lines,
        scenarios=scenarios,
        both_failed=sorted(set(table.rows) - {d for s in scenarios for d in s.depths}),
        level_fragile=level.fragile,
        trend_fragile=trend.fragile,
        results=results,
        **out,
    )


def no_comparison(scenarios: list[Scenario], **out: Any) -> DepthScalingVerdict:
    """Every reading left fewer than two depths: no comparison, naming why."""
    why = scenarios[-1].reason
    return DepthScalingVerdict("no comparison", f"no comparison: {why}", scenarios=scenarios, **out)


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
