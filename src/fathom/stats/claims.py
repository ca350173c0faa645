"""The claim checker: re-derive every claim of every sentence from the results model.

For :class:`~fathom.stats.results.Results`:

1. every family of comparisons is judged again from its stored per-seed differences and
   variances (:func:`fathom.stats.inference.judge`, same rules): verdict, level, interval
   and ``fragile`` must come out the same;
2. every decision is recomputed from the comparisons and evidence it names (the depth-scaling
   combination rule; a checkpoint ranking's rule, with the counts and orders its sentence
   must print);
3. every claim of a sentence must match its comparison (verdict, fragile), and the text must
   print each claimed comparison's verdict, estimate and interval;
4. every comparative word in a sentence (better, worse, higher, lower, equivalent,
   not established, fragile, inconclusive) must be one that a claim or decision makes.

:func:`check` returns the problems found (empty: every sentence is true of its table).
"""

from __future__ import annotations

import math
import re

from fathom.stats.inference import judge, rejudge_input
from fathom.stats.numbers import fmt_estimate, fmt_interval
from fathom.stats.ranking import RULE as RANKING_RULE
from fathom.stats.ranking import ranking_verdict, statement_parts
from fathom.stats.results import Comparison, Decision, Results, Sentence
from fathom.stats.rules import Rules
from fathom.stats.scaling_sentences import scaling_verdict
from fathom.stats.scaling_table import FailureEvidence

WORDS = (
    "better",
    "worse",
    "higher",
    "lower",
    "equivalent",
    "not established",
    "fragile",
    "inconclusive",
)


def _rejudge(results: Results) -> list[str]:
    problems = []
    families: dict[str, list[Comparison]] = {}
    for c in results.comparisons:
        families.setdefault(c.family, []).append(c)
    for family, comps in families.items():
        items = [rejudge_input(c) for c in comps]
        again = judge(family, items, Rules(level=comps[0].nominal_level))
        for c, r in zip(comps, again):
            keys = (
                "verdict",
                "fragile",
                "level",
                "low",
                "high",
                "estimate",
                "family_size",
                "loo_held",
            )
            for key in keys:
                x, y = getattr(c, key), getattr(r, key)
                same = x == y or (
                    isinstance(x, float)
                    and isinstance(y, float)
                    and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
                )
                if not same:
                    problems.append(f"{family}/{c.id}: {key} is {x!r}, re-derived {y!r}")
    return problems


def _reranking(d: Decision, results: Results, text: str) -> list[str]:
    """A ranking statement: its verdict re-derived from its pairwise comparisons, and the
    counts and orders it must print (:mod:`fathom.stats.ranking`)."""
    comps = [results.comparison(cid) for cid in d.inputs]
    verdict, _ = ranking_verdict(comps)
    problems = (
        [f"decision {d.id}: {d.verdict!r}, re-derived {verdict!r}"] if verdict != d.verdict else []
    )
    return problems + [
        f"decision {d.id}: the sentence does not print {p!r}"
        for p in statement_parts(comps)
        if p not in text
    ]


def _redecide(results: Results) -> list[str]:
    problems = []
    for d in results.decisions:
        if d.rule == RANKING_RULE:
            continue  # re-derived with the sentence that prints it (_text)
        profile = results.comparison(d.profile)
        per_depth = {i: results.comparison(cid) for i, cid in enumerate(d.per_depth)}
        evidence = [
            FailureEvidence(**{**e, "failed": tuple(e["failed"]), "other": tuple(e["other"])})
            for e in d.evidence
        ]
        verdict = scaling_verdict(profile, per_depth, evidence)
        fragile = profile.fragile and verdict.endswith("scaling")
        if (verdict, fragile) != (d.verdict, d.fragile):
            problems.append(
                f"decision {d.id}: {(d.verdict, d.fragile)}, re-derived {(verdict, fragile)}"
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
        if d.rule == RANKING_RULE:
            problems += _reranking(d, results, sentence.text)
        if d.verdict not in sentence.text:
            problems.append(f"decision {did}: the sentence does not print {d.verdict!r}")
    for word in WORDS:
        if re.search(rf"\b{word}\b", sentence.text) and word not in said:
            problems.append(f"the sentence says {word!r}, which no claim makes: {sentence.text!r}")
    return problems


def check(results: Results) -> list[str]:
    """Every problem found re-deriving the claims of ``results`` (module docstring)."""
    problems = _rejudge(results) + _redecide(results)
    for s in results.sentences:
        problems += _text(s, results)
    return problems
