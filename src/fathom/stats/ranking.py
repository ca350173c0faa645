"""Checkpoint rankings from pairwise paired comparisons (``docs/statistics.md`` §7).

Per compared metric, the ranked recipes (those without an excluded run, with a mean at both
checkpoints) are ordered by their means at the selected checkpoint (ties by name). Every pair
``(a, b)``, ``a`` ahead of ``b`` in that order, is compared paired over seeds at the selected
and at the final checkpoint (``a − b``; :func:`fathom.stats.summary_compare.metric_item`):
with ``k`` recipes, ``P = k(k − 1)/2`` pairs and one family of ``m = 2P`` comparisons, Holm
over it (§3). The ranking statement is computed from those verdicts only:

* an **order** between two recipes is established at a checkpoint only when their paired
  difference is established there (*better* / *worse*); *equivalent* is no order;
* the ranking **differs** between the checkpoints only when some pair is established in
  opposite directions at the two (a *swap*); otherwise the statement is *not established*
  and counts the pairs with an established order at each checkpoint.

The point-estimate rankings (:func:`fathom.stats.verdicts.rank_disagreement`) are shown
beside it, never as a verdict. :func:`_ranking_verdict` is the rule; the claim checker
(:mod:`fathom.stats.claims`) re-derives each statement with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, get_args

from fathom.stats.inference import Paired, judge
from fathom.stats.results import Claim, Comparison, Decision, Results, Sentence
from fathom.stats.rules import Rules
from fathom.stats.sentences import comparison_sentence, comparison_text, verdict_words
from fathom.stats.summary_compare import CHECKPOINTS, COMPARED_METRICS, metric_item
from fathom.stats.verdicts import OPPOSITE, RankingVerdict, rank_disagreement

RULE = "checkpoint ranking"
DIFFERS, NOT_ESTABLISHED = get_args(RankingVerdict)


def _family_of(label: str) -> str:
    """The family name of one metric's pairwise comparisons."""
    return f"ranking by {label}"


def _pairwise_items(
    metric: tuple[str, str], order: Sequence[str], usable: Mapping[str, Sequence[Any]]
) -> list[Paired]:
    """Every pair of ``order`` (ahead first) at both checkpoints: one family."""
    key, _ = metric
    return [
        metric_item(
            f"pair/{key}/{a}/{b}/{where}",
            (a, b),
            where,
            metric,
            usable,
            context={"metric": key, "checkpoint": where, "pair": f"{a}|{b}"},
        )
        for a, b in itertools.combinations(order, 2)
        for where in CHECKPOINTS
    ]


def _by_pair(comps: Sequence[Comparison]) -> dict[tuple[str, str], dict[str, Comparison]]:
    pairs: dict[tuple[str, str], dict[str, Comparison]] = {}
    for c in comps:
        pairs.setdefault((c.a, c.b), {})[c.context["checkpoint"]] = c
    return pairs


def ordered(c: Comparison) -> bool:
    """Whether a comparison establishes an order (better / worse, higher / lower)."""
    return c.verdict in OPPOSITE


def _ranking_verdict(comps: Sequence[Comparison]) -> tuple[str, list[tuple[str, str]]]:
    """``(verdict, swaps)``: ``differs`` with the pairs established in opposite directions at
    the two checkpoints, else ``not established`` (module docstring)."""
    swaps = [
        pair
        for pair, at in _by_pair(comps).items()
        if all(w in at and ordered(at[w]) for w in CHECKPOINTS)
        and OPPOSITE[at["selected"].verdict] == at["final"].verdict
    ]
    return (DIFFERS if swaps else NOT_ESTABLISHED), sorted(swaps)


def _order_phrase(c: Comparison) -> str:
    """``"plain worse than residual"``: the order one established comparison states
    (``" (fragile)"`` after it when one seed carries it)."""
    return f"{c.a} {c.verdict} than {c.b}" + (" (fragile)" if c.fragile else "")


def _orders_at(comps: Sequence[Comparison], where: str) -> tuple[str, list[str]]:
    """``("2 of 10 pair(s) at the final checkpoint", ["plain worse than residual", ...])``."""
    at = [c for c in comps if c.context["checkpoint"] == where and ordered(c)]
    return f"{len(at)} of {len(_by_pair(comps))} pair(s) at the {where} checkpoint", [
        _order_phrase(c) for c in at
    ]


def _statement_parts(comps: Sequence[Comparison]) -> list[str]:
    """What a ranking statement must print, re-derived from its comparisons: the count of
    pairs with an established order at each checkpoint and each of those orders."""
    parts = []
    for where in CHECKPOINTS:
        count, phrases = _orders_at(comps, where)
        parts += [count, *phrases]
    return parts


def _orders(comps: Sequence[Comparison]) -> str:
    texts = []
    for where in CHECKPOINTS:
        count, phrases = _orders_at(comps, where)
        texts.append(count + (f" ({', '.join(phrases)})" if phrases else ""))
    return "; ".join(texts)


def rederive_ranking(d: Decision, results: Results) -> tuple[str, bool]:
    """A ranking decision's verdict from its pairwise comparisons (never fragile: it states
    established orders, each comparison's own fragility printed with it)."""
    verdict, _ = _ranking_verdict([results.comparison(cid) for cid in d.inputs])
    return verdict, False


def ranking_prints(d: Decision, results: Results) -> list[str]:
    """The counts and orders a sentence stating ranking decision ``d`` must print."""
    return _statement_parts([results.comparison(cid) for cid in d.inputs])


def _ranking_statement(
    metric: tuple[str, str], comps: Sequence[Comparison], reorder: int
) -> tuple[Decision, Sentence, dict[str, Any]]:
    """The ranking decision, its sentence and its JSON claim (``reorder``: how many pairs
    the recipe means order differently at the two checkpoints)."""
    key, label = metric
    verdict, swaps = _ranking_verdict(comps)
    pairs = _by_pair(comps)
    own = [c for c in comps if c.family == _family_of(label)]
    shared = [c for c in comps if c.family != _family_of(label)]
    m = max((c.family_size for c in own), default=0)
    parts = []
    if own:
        n_own = len({(c.a, c.b) for c in own})
        parts.append(
            f"Holm over the {m} comparisons of this ranking, {n_own} pair(s) × 2 checkpoints"
        )
    if shared:
        parts.append(
            f"the {len(shared)} against the reference are the comparisons above, one verdict "
            f"each (Holm over their family of {max(c.family_size for c in shared)})"
        )
    family = "every pair paired over seeds; " + "; ".join(parts)
    orders = _orders(comps)
    claims = [
        Claim(comparison=c.id, verdict=c.verdict, fragile=c.fragile, brief=True)
        for c in comps
        if ordered(c)
    ]
    if verdict == DIFFERS:
        told = []
        for a, b in swaps:
            sel, fin = pairs[(a, b)]["selected"], pairs[(a, b)]["final"]
            told.append(
                f"{a} vs {b} is {verdict_words(sel)} at the selected checkpoint "
                f"({comparison_text(sel)}) and {verdict_words(fin)} at the final one "
                f"({comparison_text(fin)})"
            )
            claims += [
                Claim(comparison=c.id, verdict=c.verdict, fragile=c.fragile) for c in (sel, fin)
            ]
        text = (
            f"The ranking by {label} differs between the selected and final checkpoints: "
            f"{'; '.join(told)}. Established orders: {orders} ({family})."
        )
    else:
        means = (
            f"the recipe means reorder ({reorder} pair(s) swap), but "
            if reorder
            else "the recipe means keep their order; "
        )
        text = (
            f"The ranking by {label} is not established to differ between the selected and "
            f"final checkpoints: {means}no pair is established in opposite directions. "
            f"Established orders: {orders} ({family})."
        )
    decision = Decision(
        id=f"ranking/{key}", rule=RULE, verdict=verdict, inputs=[c.id for c in comps]
    )
    claim = {
        "verdict": verdict,
        "differs": verdict == DIFFERS,
        "swaps": [list(p) for p in swaps],
        "family_size": m,
        "pairs": len(pairs),
        "established": {
            w: [[c.a, c.b, c.verdict] for c in comps if c.context["checkpoint"] == w and ordered(c)]
            for w in CHECKPOINTS
        },
        "sentence": text,
    }
    return decision, Sentence(text=text, claims=claims, decisions=[decision.id]), claim


def _swapped_pairs(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Pairs ``(a, b)`` whose means are ranked in one order at the selected checkpoint and
    the other at the final one (``a`` ahead at the selected checkpoint): point estimates."""
    out = []
    for x, y in itertools.combinations(rows, 2):
        sel = x["selected_rank"] - y["selected_rank"]
        fin = x["final_rank"] - y["final_rank"]
        if sel * fin < 0:
            a, b = (x, y) if sel < 0 else (y, x)
            out.append((str(a["name"]), str(b["name"])))
    return out


def _judged(
    family: str,
    items: Sequence[Paired],
    main: Mapping[tuple[str, str, str], Comparison],
    rules: Rules,
) -> list[Comparison]:
    """The pairs of one metric: a pair already compared on the page (``main``, keyed by
    ``(a, b, id suffix)`` in either order) keeps that comparison and its verdict; the others
    are judged as this ranking's Holm family."""
    shared: dict[str, Comparison] = {}
    for p in items:
        a, b, where = p.a, p.b, p.context["checkpoint"]
        key = p.context["metric"]
        for (x, y), flip in (((a, b), False), ((b, a), True)):
            c = main.get((x, y, f"{where}/{key}"))
            if c is not None and c.verdict != "no comparison":
                shared[p.id] = c.relabelled(p.id, p.context, mirror=flip)
    own = judge(family, [p for p in items if p.id not in shared], rules)
    by_id = {c.id: c for c in own} | shared
    return [by_id[p.id] for p in items]


def rankings(
    recipes: Mapping[str, Any],
    ranked: Sequence[str],
    usable: Mapping[str, Sequence[Any]],
    rules: Rules,
    main: Mapping[tuple[str, str, str], Comparison] | None = None,
) -> tuple[dict[str, Any], list[Comparison], list[Sentence], list[Decision]]:
    """Per compared metric with at least two ranked recipes (a mean at both checkpoints):
    the rankings of the means side by side, the pairwise comparisons, a sentence per
    comparison, and the ranking statement (``rankings[key]["claim"]``). A pair the page
    already compares (``main``: the summary's recipe-against-reference comparisons, keyed
    ``(recipe, reference, "checkpoint/metric")``) is that comparison, printed with its one
    verdict; the other pairs are one Holm family per metric."""
    out: dict[str, Any] = {}
    comps: list[Comparison] = []
    sentences: list[Sentence] = []
    decisions: list[Decision] = []
    for key, label, higher in COMPARED_METRICS:
        sel = {n: recipes[n]["selected"][key]["mean"] for n in ranked}
        fin = {n: recipes[n]["final"][key]["mean"] for n in ranked}
        keep = [n for n in ranked if sel[n] is not None and fin[n] is not None]
        if len(keep) < 2:
            continue
        rc = rank_disagreement(
            {n: sel[n] for n in keep}, {n: fin[n] for n in keep}, higher_is_better=higher
        )
        items = _pairwise_items((key, label), rc.selected_order, usable)
        family = _judged(_family_of(label), items, main or {}, rules)
        decision, sentence, claim = _ranking_statement(
            (key, label), family, len(_swapped_pairs(rc.rows))
        )
        out[key] = {
            "label": label,
            **rc.to_dict(),
            "pairs": [{"a": c.a, "b": c.b, **c.context, **c.verdict_fields()} for c in family],
            "claim": claim,
        }
        comps += family
        sentences += [*(comparison_sentence(c) for c in family), sentence]
        decisions.append(decision)
    return out, comps, sentences, decisions
