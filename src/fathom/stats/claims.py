"""The claim checker: re-derive every claim of every sentence from the results model.

For :class:`~fathom.stats.results.Results`:

1. every family of comparisons is judged again from its stored per-seed differences and
   variances (:func:`fathom.stats.inference.judge`, same rules): verdict, level, interval
   and ``fragile`` must come out the same (a comparison printed twice counts once);
2. every decision is recomputed from the comparisons and evidence it names, by the row of its
   rule in :data:`DECISION_RULES` (the depth-scaling level, scaling and both-readings rules;
   a checkpoint ranking's rule, with the counts and orders its sentence must print; the
   language model's depth-scaling rule, recomputed from every run's recorded nats/token,
   with the numbers its sentence must print); a rule
   without a row is refused (:func:`decision_rule`), never skipped;
3. every claim of a sentence must match its comparison (verdict, fragile), and the text must
   print each claimed comparison's verdict, estimate and interval;
4. every comparative word in a sentence (better, worse, higher, lower, equivalent,
   not established, fragile, inconclusive) must be one that a claim or decision makes;
5. no comparison (the same arms, quantity and scope) is printed twice with two verdicts:
   one family per page.

:func:`check` returns the problems found (empty: every sentence is true of its table).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from fathom.errors import FathomError
from fathom.stats.inference import judge, rejudge_input
from fathom.stats.lm_scaling import LM_RULE, lm_prints, rederive_lm
from fathom.stats.numbers import fmt_estimate, fmt_interval
from fathom.stats.ranking import RULE as RANKING_RULE
from fathom.stats.ranking import ranking_prints, rederive_ranking
from fathom.stats.results import Comparison, Decision, Results, Sentence
from fathom.stats.rules import Rules
from fathom.stats.scaling_answers import (
    BOTH_WAYS_RULE,
    LEVEL_RULE,
    TREND_RULE,
    rederive_both_ways,
    rederive_level,
    rederive_trend,
)
from fathom.stats.verdicts import OPPOSITE

_WORDS = (
    "better",
    "worse",
    "higher",
    "lower",
    "equivalent",
    "not established",
    "fragile",
    "inconclusive",
)


_KEYS = ("verdict", "fragile", "level", "low", "high", "estimate", "family_size", "loo_held")


def _same(x: object, y: object) -> bool:
    return x == y or (
        isinstance(x, float)
        and isinstance(y, float)
        and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
    )


def _rejudge(results: Results) -> list[str]:
    """Every family judged again; a comparison printed twice (another id, maybe as b against
    a) counts once and must equal the first, mirrored where its arms are swapped."""
    problems = []
    families: dict[str, dict[tuple, list[Comparison]]] = {}
    for c in results.comparisons:
        families.setdefault(c.family, {}).setdefault(_what(c), []).append(c)
    for family, groups in families.items():
        firsts = [g[0] for g in groups.values()]
        items = [rejudge_input(c) for c in firsts]
        again = judge(family, items, Rules(level=firsts[0].nominal_level))
        for group, r in zip(groups.values(), again):
            for c in group:
                want = r.relabelled(c.id, c.context, mirror=c.a != r.a)
                problems += [
                    f"{family}/{c.id}: {key} is {getattr(c, key)!r}, re-derived "
                    f"{getattr(want, key)!r}"
                    for key in _KEYS
                    if not _same(getattr(c, key), getattr(want, key))
                ]
    return problems


def _nothing(d: Decision, results: Results) -> list[str]:
    return []


@dataclass(frozen=True)
class DecisionRule:
    """How the checker re-derives a decision of one rule: ``rederive(decision, results)`` its
    ``(verdict, fragile)`` from the comparisons and decisions it names, and
    ``prints(decision, results)`` what a sentence stating it must print besides its verdict."""

    rederive: Callable[[Decision, Results], tuple[str, bool]]
    prints: Callable[[Decision, Results], list[str]] = _nothing


DECISION_RULES: dict[str, DecisionRule] = {
    LEVEL_RULE: DecisionRule(rederive_level),
    TREND_RULE: DecisionRule(rederive_trend),
    BOTH_WAYS_RULE: DecisionRule(rederive_both_ways),
    RANKING_RULE: DecisionRule(rederive_ranking, prints=ranking_prints),
    LM_RULE: DecisionRule(rederive_lm, prints=lm_prints),
}
"""Every rule a :class:`~fathom.stats.results.Decision` can name, with its re-derivation
(written beside the rule it re-derives). A new verdict rule is its module (the rule and its
``rederive``) and one row here."""


def decision_rule(name: str) -> DecisionRule:
    """The row of rule ``name``; a rule without one is refused naming the known rules (a
    decision the checker cannot re-derive is never passed over)."""
    row = DECISION_RULES.get(name)
    if row is None:
        known = ", ".join(repr(k) for k in DECISION_RULES)
        raise FathomError(
            f"decision rule {name!r} has no re-derivation in fathom.stats.claims."
            f"DECISION_RULES (known: {known}); add its row there beside the rule's module"
        )
    return row


def _redecide(results: Results) -> list[str]:
    problems = []
    for d in results.decisions:
        verdict, fragile = decision_rule(d.rule).rederive(d, results)
        if verdict != d.verdict:
            problems.append(f"decision {d.id}: {d.verdict!r}, re-derived {verdict!r}")
        elif fragile != d.fragile:
            problems.append(f"decision {d.id}: fragile is {d.fragile}, re-derived {fragile}")
    return problems


_NAMING = ("recipe", "pair", "caveat")
"""Context keys that only name or annotate a comparison (who is the recipe, the pair's
order, a caveat); every other key (metric, checkpoint, scope, reading, ...) says what it is."""


def _what(c: Comparison) -> tuple:
    """What a comparison compares: its arms (unordered), its quantity and its context."""
    ctx = frozenset((k, v) for k, v in c.context.items() if k not in _NAMING)
    return (frozenset((c.a, c.b)), c.quantity.name, ctx)


def _twice(results: Results) -> list[str]:
    """The same comparison printed twice on one page with two verdicts (in two families)."""
    problems, seen = [], {}
    for c in results.comparisons:
        first = seen.setdefault(_what(c), c)
        if first is c:
            continue
        same = c.verdict if c.a == first.a else OPPOSITE.get(c.verdict, c.verdict)
        if same != first.verdict:
            problems.append(
                f"{first.a} vs {first.b} on {c.quantity.name}: {first.verdict!r} in "
                f"{first.family!r} ({first.id}) but {c.verdict!r} in {c.family!r} ({c.id}); "
                "one comparison gets one verdict per page (one family)"
            )
    return problems


def _text(sentence: Sentence, results: Results) -> list[str]:
    problems, said = [], set()
    for claim in sentence.claims:
        c = results.comparison(claim.comparison)
        if (claim.verdict, claim.fragile) != (c.verdict, c.fragile):
            problems.append(
                f"claim on {c.id}: {claim.verdict!r} but the comparison is {c.verdict!r}"
            )
        said |= {c.verdict} | ({"fragile"} if c.fragile else set())
        expect = [c.verdict] if c.verdict == "no comparison" else [c.verdict, fmt_estimate(c)]
        if c.low is not None:
            expect.append(fmt_interval(c))
        if claim.brief:
            expect = [c.verdict]
            full = [
                s
                for s in results.sentences
                for k in s.claims
                if k.comparison == c.id and not k.brief
            ]
            if not full:
                problems.append(f"{c.id}: claimed briefly, but no sentence prints its numbers")
        problems += [
            f"{c.id}: the sentence does not print {e!r}" for e in expect if e not in sentence.text
        ]
    for did in sentence.decisions:
        d = next(x for x in results.decisions if x.id == did)
        said |= {d.verdict, *d.verdict.split()} | ({"fragile"} if d.fragile else set())
        problems += [
            f"decision {did}: the sentence does not print {p!r}"
            for p in decision_rule(d.rule).prints(d, results)
            if p not in sentence.text
        ]
        if d.verdict not in sentence.text:
            problems.append(f"decision {did}: the sentence does not print {d.verdict!r}")
    for word in _WORDS:
        if re.search(rf"\b{word}\b", sentence.text) and word not in said:
            problems.append(f"the sentence says {word!r}, which no claim makes: {sentence.text!r}")
    return problems


def check(results: Results) -> list[str]:
    """Every problem found re-deriving the claims of ``results`` (module docstring)."""
    problems = _rejudge(results) + _redecide(results) + _twice(results)
    for s in results.sentences:
        problems += _text(s, results)
    return problems
