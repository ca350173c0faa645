"""The language model's depth-scaling verdict: a candidate arm (LayerDrop) against a baseline
(dense) in nats per token, the level and the trend answered apart (``docs/statistics.md``
§5), and its row of the claim checker, which re-derives it from the per-run numbers.

Per run: ``ce``, the test nats/token at the epoch of minimum validation nats/token. The rule
is the depth-scaling rule of :mod:`fathom.stats.scaling` with cross-entropy for accuracy
(its contrasts :func:`~fathom.stats.scaling.profile_items`, its family and answers
:func:`~fathom.stats.scaling.judged_scenario`, its sentences those of
:mod:`fathom.stats.scaling_sentences`):

1. **Runs.** A run *failed* when it diverged, its score is missing or non-finite, or its test
   nats/token is no lower than the unigram baseline's (``unigram_ce``: byte frequencies
   alone, the language model's chance level). A failed run enters every statistic at the
   unigram baseline: a failure is evidence, never an exclusion. (There is no *undetermined*
   reading: the baseline is a number, not an interval.) Every depth and arm needs every
   seed, else ``no comparison``; an arm that failed at every depth: ``no conclusion``.
2. **Depths.** A depth where every run of both arms failed is left out, named; fewer than
   two left: ``no comparison``.
3. **Contrasts**, paired over seeds, ``g_s(d) = ce_cand,s(d) − ce_base,s(d)`` in nats
   (lower is better)::

       level   L_s = (1/K) Σ_{d∈D} g_s(d)
       change  C_s = g_s(d₁) − g_s(d₀)
       slope   B_s = Σ_d (d − d̄) g_s(d) / Σ_d (d − d̄)²      (nats/layer)

   judged in one Holm family with the per-depth comparisons (smallest effect
   ``rules.ce_nats``; ``rules.ce_nats / (d₁ − d₀)`` per layer for the slope; resolution
   ``rules.ce_resolution_nats``, spread the same way).
4. **Answers**: the level from the level contrast unless a per-depth comparison points the
   other way (then inconclusive; no failure evidence enters: a run's failure is a number
   here, entered at the baseline); the scaling only from the change and the slope agreeing.
   A level difference alone never says "scales better". An established answer one seed
   carries is *fragile*.

The two answers are two :class:`~fathom.stats.results.Decision` s, ``level`` and ``trend``,
of the rule :data:`LM_RULE`; each records every run (:attr:`Decision.records`), so
:func:`rederive_lm` recomputes the answer from the per-run nats/token themselves, and
:func:`lm_prints` makes a sentence print the re-derived numbers it rests on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from fathom.errors import FathomError
from fathom.stats.numbers import fmt_estimate, fmt_interval
from fathom.stats.quantities import cross_entropy
from fathom.stats.results import Comparison, Decision, Quantity, Results, Sentence
from fathom.stats.rules import DEFAULT_RULES, Rules
from fathom.stats.scaling import judged_scenario, profile_items
from fathom.stats.scaling_sentences import level_sentence, trend_sentence
from fathom.stats.sentences import comparison_sentence, family_note

LM_RULE = "language-model depth scaling, re-derived from per-run nats/token"
FAMILY = "language-model depth scaling"
_QUESTIONS = ("level", "trend")
"""The ids of the rule's two decisions: the question each answers."""


@dataclass(frozen=True)
class LMRunRecord:
    """One run's inputs; ``None`` where not recorded. ``ce``: test nats/token at the selected
    epoch; ``unigram_ce``: the unigram baseline's validation nats/token."""

    depth: int
    arm: str
    seed: int
    status: str
    ce: float | None
    unigram_ce: float | None
    selected_epoch: int | None = None
    run_dir: str | None = None

    @property
    def ppl(self) -> float | None:
        """Perplexity ``exp(ce)``."""
        return None if self.ce is None else math.exp(self.ce)

    @property
    def failed(self) -> bool:
        """Diverged, unscored, or no lower than the unigram baseline (module rule 1)."""
        if self.status == "diverged" or self.ce is None or not math.isfinite(self.ce):
            return True
        return self.unigram_ce is not None and self.ce >= self.unigram_ce


@dataclass(frozen=True)
class _Arms:
    baseline: str
    candidate: str


@dataclass
class LMVerdict:
    """The two answers, the lines they rest on, every judged comparison and the typed
    results (sentences, comparisons and the two decisions) the claim checker re-derives."""

    level: str
    trend: str
    lines: list[str]
    depths: list[int] = field(default_factory=list)
    left_out: list[int] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    level_fragile: bool = False
    trend_fragile: bool = False
    results: Results = field(default_factory=Results)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the results model included, for the claim checker)."""
        return {
            "level": self.level,
            "trend": self.trend,
            "level_fragile": self.level_fragile,
            "trend_fragile": self.trend_fragile,
            "lines": self.lines,
            "depths": self.depths,
            "left_out": self.left_out,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "results": self.results.model_dump(mode="json"),
        }


def _entered(r: LMRunRecord) -> float:
    """The value a run enters the statistics with: its nats/token, or the baseline if failed."""
    if r.failed:
        if r.unigram_ce is None:
            raise FathomError(
                f"run {r.run_dir} failed and records no unigram baseline to enter it at; "
                "retrain it with this version (data.info.unigram_val_ce)"
            )
        return r.unigram_ce
    assert r.ce is not None
    return r.ce


def _unjudged(
    verdict: Literal["no comparison", "no conclusion"], line: str, records: dict, **kw: Any
) -> LMVerdict:
    """``no comparison`` / ``no conclusion``: both decisions, one sentence naming why."""
    decisions = [Decision(id=q, rule=LM_RULE, verdict=verdict, records=records) for q in _QUESTIONS]
    sentence = Sentence(text=line, decisions=list(_QUESTIONS))
    results = Results(sentences=[sentence], decisions=decisions)
    return LMVerdict(verdict, verdict, [line], results=results, **kw)


def lm_depth_verdict(
    records: list[LMRunRecord], arms: tuple[str, str], rules: Rules = DEFAULT_RULES
) -> LMVerdict:
    """Level and scaling of ``arms = (baseline, candidate)`` (module docstring)."""
    baseline, candidate = arms
    rec = {"arms": list(arms), "rules": rules.model_dump(), "runs": [asdict(r) for r in records]}
    by: dict[tuple[int, str], dict[int, LMRunRecord]] = {}
    for r in records:
        by.setdefault((r.depth, r.arm), {})[r.seed] = r
    depths_all = sorted({r.depth for r in records})
    seeds = sorted({r.seed for r in records})
    missing = [
        f"{arm} at depth {d}"
        for d in depths_all
        for arm in arms
        if sorted(by.get((d, arm), {})) != seeds
    ]
    if missing or not records:
        listed = ", ".join(missing) or "none recorded"
        why = f"no comparison: runs missing ({listed}); every depth and arm needs every seed"
        return _unjudged("no comparison", why, rec)
    for arm in arms:
        if all(by[(d, arm)][s].failed for d in depths_all for s in seeds):
            line = (
                f"no conclusion: the {arm} arm failed (diverged, or its nats/token never got "
                "below the unigram baseline's) at every depth"
            )
            return _unjudged("no conclusion", line, rec)
    left = [d for d in depths_all if all(by[(d, a)][s].failed for a in arms for s in seeds)]
    depths = [d for d in depths_all if d not in left]
    if len(depths) < 2:
        why = (
            f"no comparison: {len(depths)} depth(s) where an arm did not fail on every seed; "
            "the two questions need two"
        )
        return _unjudged("no comparison", why, rec, depths=depths, left_out=left)
    span = depths[-1] - depths[0]
    slope_q = Quantity(
        name="least-squares slope of test nats/token over depth (nats per layer)",
        unit="nats",
        higher_is_better=False,
        smallest_effect=rules.ce_nats / span,
        resolution=rules.ce_resolution_nats / span,
    )
    quantities = (
        cross_entropy("test nats/token", rules),
        cross_entropy("change in test nats/token with depth", rules),
        slope_q,
        cross_entropy("test nats/token", rules),
    )
    items = profile_items(
        lambda a, d, s: _entered(by[(d, a)][s]), depths, seeds, (candidate, baseline), quantities
    )
    s = judged_scenario("", FAMILY, depths, items, [], rules)
    names = _Arms(baseline, candidate)
    (level_s, level_d), (trend_s, trend_d) = level_sentence(names, s), trend_sentence(names, s)
    decisions = [d.model_copy(update={"rule": LM_RULE, "records": rec}) for d in (level_d, trend_d)]
    comps = [s.level_contrast, s.change, s.slope, *s.per_depth.values()]
    judged = [c for c in comps if c is not None]
    notes = []
    if left:
        notes.append(f"left out: depth(s) {left} (both arms failed on every seed)")
    notes.append(f"family {FAMILY!r}: {family_note(judged, rules.level)}")
    results = Results(
        comparisons=judged,
        sentences=[
            level_s,
            trend_s,
            *(Sentence(text=n) for n in notes),
            *(comparison_sentence(c) for c in s.per_depth.values()),
        ],
        decisions=decisions,
        caveats=notes[-1:],
    )
    return LMVerdict(
        s.level,
        s.trend,
        [level_s.text, trend_s.text, *notes],
        depths,
        left,
        judged,
        level_fragile=decisions[0].fragile,
        trend_fragile=decisions[1].fragile,
        results=results,
    )


# ---- the claim checker's row ----------------------------------------------------------------


def _again(d: Decision) -> tuple[LMVerdict, Decision]:
    """The whole verdict recomputed from the decision's records, and its decision ``d.id``."""
    if d.id not in _QUESTIONS:
        raise FathomError(
            f"decision {d.id!r} of rule {LM_RULE!r} answers no question of it; its decisions "
            f"are {list(_QUESTIONS)}"
        )
    try:
        recs = d.records
        records = [LMRunRecord(**r) for r in recs["runs"]]
        baseline, candidate = recs["arms"]
        verdict = lm_depth_verdict(records, (baseline, candidate), Rules(**recs["rules"]))
    except (KeyError, TypeError, ValueError) as e:
        raise FathomError(
            f"decision {d.id!r} of rule {LM_RULE!r} has unreadable records ({e}); it must "
            "record its arms, its rules and every run, as lm_depth_verdict writes them"
        ) from e
    return verdict, next(x for x in verdict.results.decisions if x.id == d.id)


def rederive_lm(d: Decision, results: Results) -> tuple[str, bool]:
    """The decision's ``(verdict, fragile)`` recomputed from its recorded per-run nats/token
    (every run, the arms and the rules), never from the comparisons printed beside it."""
    _, again = _again(d)
    return again.verdict, again.fragile


def lm_prints(d: Decision, results: Results) -> list[str]:
    """What a sentence stating ``d`` must print: the estimate and interval of every contrast
    the re-derived answer rests on (the level contrast, or the change and the slope), so a
    record or a printed number changed after the fact is caught."""
    verdict, again = _again(d)
    if verdict.results.comparisons == []:
        return []
    ids = [again.profile] if d.id == "level" else list(again.inputs)
    out = []
    for cid in ids:
        c = verdict.results.comparison(cid)
        out.append(fmt_estimate(c))
        if c.low is not None:
            out.append(fmt_interval(c))
    return out
