"""The depth-scaling verdict: two questions about a candidate arm against a baseline,
answered apart.

* the **level**: is the candidate better than the baseline across the depths?
* the **scaling** (trend): does the candidate's advantage change with depth? Only this
  answer says "scales better / worse".

Input: a table ``rows[depth][arm]`` of per-seed runs (test accuracy on ``n_eval`` examples
of ``classes`` classes, status). The rule (``docs/statistics.md`` §5), in order:

1. **Bad input** (:func:`_bad_table`: wrong types, accuracies
   outside [0, 1] or in percent, one depth, one class, no test-set size, unequal or missing
   seeds, an incomplete run, a non-finite accuracy of a run that did not diverge) gives
   ``no comparison`` naming the reason and its fix.
2. **Runs.** Each run is *trained*, *failed* or *undetermined* against chance
   (:func:`fathom.stats.chance.chance_test`); a diverged run failed. A failed run enters
   every statistic at chance accuracy ``1/C``: a failure is evidence, never an exclusion.
   An arm with no trained run at any depth: ``no conclusion`` for both questions.
3. **Readings.** An undetermined run is read both ways: at chance (failed) and at its
   measured value. Everything below is computed for each reading; an answer stands only
   where both readings give it, otherwise it is ``not established``, naming both.
4. **Depths.** A depth where every run of both arms failed is left out, named, and joins
   no family (chance against chance says nothing). Fewer than two depths left (``D``, with
   shallowest ``d₀`` and deepest ``d₁``): ``no comparison``.
5. **Contrasts**, paired over seeds, with ``g_s(d) = cand_s(d) − base_s(d)`` in pp and the
   binomial bound ``u = 10⁴/(4N)`` pp² of one accuracy::

       level   L_s = (1/K) Σ_{d∈D} g_s(d)          (K depths in D)    floor v_s = 2u/K
       change  C_s = g_s(d₁) − g_s(d₀)                               floor v_s = 4u
       slope   B_s = Σ_d (d − d̄) g_s(d) / Σ_d (d − d̄)²   (pp/layer)  floor v_s = 2u/Σ(d − d̄)²

   judged by :mod:`fathom.stats.inference` (smallest effect ``rules.accuracy_pp`` for the
   level and the change, ``rules.accuracy_pp / (d₁ − d₀)`` per layer for the slope) in
   one Holm family with the per-depth paired comparisons at every ``d ∈ D``.
6. **Failure evidence**: at each depth of ``D`` where the arms' failure counts differ, the
   two-sided Fisher exact test; *decisive* when Holm over those depths rejects.
7. **Answers** (:mod:`fathom.stats.scaling_sentences`). Level: the level contrast's verdict
   gives ``better / worse / equivalent across depths`` unless an established per-depth
   comparison or decisive failure evidence points the other way (for *equivalent*: any
   way), then ``inconclusive``. Scaling: ``scales better / worse / equivalently`` when the
   change and the slope give that same verdict, ``inconclusive`` when both are established
   and differ, else ``not established``. An established answer whose contrast one seed
   carries is ``fragile``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real

from fathom.base.units import percent
from fathom.stats.chance import chance_test
from fathom.stats.flags import RUN_STATUSES
from fathom.stats.inference import Paired, judge, paired
from fathom.stats.quantities import (
    ACCURACY_RESOLUTION_PP,
    accuracy,
    accuracy_variance_pp,
    fraction_problem,
)
from fathom.stats.results import Quantity
from fathom.stats.rules import DEFAULT_RULES, Rules
from fathom.stats.scaling_answers import level_verdict, trend_verdict
from fathom.stats.scaling_sentences import assemble, no_comparison, observations
from fathom.stats.scaling_table import (
    ArmRuns,
    DepthScalingTable,
    DepthScalingVerdict,
    FailedRun,
    FailureEvidence,
    Scenario,
)

FAMILY = "depth scaling"
_READINGS = ("at chance", "at their values")
"""How an undetermined run is read: as failed (at chance ``1/C``), and at its measured value."""

_RunStates = dict[int, dict[str, dict[int, tuple[str, float, list[str]]]]]
_Resolved = dict[int, dict[str, dict[int, tuple[bool, float]]]]
_PerSeed = Callable[[str, int], float]


# -- rule 1, the input checks: a table no rule can judge is refused, naming the problem and its
# fix (``no comparison: …``), never an exception or a verdict. Refused: counts that are not
# integers (classes, test-set size), depth keys or seeds that are not integers, statuses
# outside RUN_STATUSES (fathom.stats.flags), accuracies that are not numbers, lie outside
# [0, 1] or look like percent ("divide by 100"), two arms with one name, fewer than two
# classes or depths, an unknown test-set size, missing arms, unequal seeds, an incomplete run,
# a non-finite accuracy of a run that did not diverge.


def _count(x: object) -> bool:
    """An integer (a Python or NumPy integer; ``bool`` is not one)."""
    return isinstance(x, Integral) and not isinstance(x, bool)


def _number(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def _types(table: DepthScalingTable) -> str | None:
    """Why the table's counts, keys, seeds, statuses or accuracies have the wrong type."""
    if not _count(table.classes):
        return f"the class count {table.classes!r} is not an integer"
    if table.n_eval is not None and not _count(table.n_eval):
        return f"the test-set size {table.n_eval!r} is not an integer count of examples"
    if not isinstance(table.rows, dict):
        return "rows must map each depth to its arms"
    bad = [d for d in table.rows if not _count(d)]
    if bad:
        return (
            f"depth keys {[*table.rows]!r} are not all integers (numbers of layers); "
            "give every depth as an int"
        )
    for d, cells in table.rows.items():
        if not isinstance(cells, dict):
            return f"depth {d}: the arms must be a mapping of arm name to its runs"
        for arm, runs in cells.items():
            if not isinstance(runs, ArmRuns):
                return f"depth {d}, arm {arm!r}: expected ArmRuns, got {type(runs).__name__}"
            for name in ("test_acc", "status"):
                if not isinstance(getattr(runs, name), list | tuple):
                    return f"depth {d}, arm {arm!r}: {name} must be a list, one entry per seed"
            seeds = runs.seed_ids()
            if not all(_count(s) for s in seeds):
                return f"depth {d}, arm {arm!r}: seeds {seeds!r} are not all integers"
            if any(a is not None and not _number(a) for a in runs.test_acc):
                return f"depth {d}, arm {arm!r}: accuracies {runs.test_acc!r} are not all numbers"
    return None


def _units(table: DepthScalingTable) -> str | None:
    """A table whose accuracies are not fractions in [0, 1] (percent-looking named)."""
    return fraction_problem(
        a for cells in table.rows.values() for runs in cells.values() for a in runs.test_acc
    )


def _bad_table(table: DepthScalingTable) -> str | None:
    """Why ``table`` allows no comparison (bad input, named with its fix), or None."""
    arms = (table.baseline, table.candidate)
    why = _types(table)
    if why is not None:
        return why
    if table.baseline == table.candidate:
        return f"baseline and candidate are both {table.baseline!r}"
    if table.classes < 2:
        return f"{table.classes} class(es): chance and failure need at least 2 classes"
    if not table.n_eval or table.n_eval < 1:
        return "the test-set size is unknown: a run's accuracy cannot be judged against chance"
    if len(table.rows) < 2:
        return f"{len(table.rows)} depth(s): a depth profile needs at least two depths"
    seeds: set[int] | None = None
    for depth, cells in sorted(table.rows.items()):
        missing = [a for a in arms if a not in cells]
        if missing:
            return f"depth {depth} lacks arm(s) {missing}"
        for arm in arms:
            runs = cells[arm]
            n = len(runs.test_acc)
            if n == 0 or len(runs.status) != n or len(runs.ce_list()) != n:
                return f"depth {depth}, arm {arm!r}: one accuracy, status and CE per seed needed"
            ids = runs.seed_ids()
            if len(ids) != n or len(set(ids)) != n:
                return f"depth {depth}, arm {arm!r}: seeds {ids} are not one per run"
            if seeds is None:
                seeds = set(ids)
            if set(ids) != seeds:
                return (
                    f"unequal seeds: depth {depth}, arm {arm!r} has seeds {sorted(ids)}, "
                    f"another cell {sorted(seeds)}; every cell needs the same seeds"
                )
            for s, acc, st in zip(ids, runs.test_acc, runs.status):
                if st not in RUN_STATUSES:
                    return (
                        f"depth {depth}, arm {arm!r}, seed {s}: unknown status {st!r} "
                        f"(one of {list(RUN_STATUSES)})"
                    )
                if st in ("failed", "running", "interrupted"):
                    return f"missing seed: depth {depth}, arm {arm!r}, seed {s} is {st}"
                finite = acc is not None and math.isfinite(float(acc))
                if st != "diverged" and not finite:
                    return f"depth {depth}, arm {arm!r}, seed {s}: accuracy {acc!r} is not finite"
    return _units(table)


# -- the rule ------------------------------------------------------------------------------
def _states(table: DepthScalingTable, rules: Rules) -> _RunStates:
    """``[depth][arm][seed] -> (state, measured accuracy or chance, flags)`` (rule 2)."""
    out: _RunStates = {}
    chance = 1.0 / table.classes
    for d in sorted(table.rows):
        out[d] = {}
        for arm in (table.baseline, table.candidate):
            runs = table.rows[d][arm]
            out[d][arm] = {}
            for s, acc, st in zip(runs.seed_ids(), runs.test_acc, runs.status):
                finite = acc is not None and math.isfinite(float(acc))
                if st == "diverged" or not finite:
                    out[d][arm][s] = ("failed", chance, ["diverged"])
                    continue
                ct = chance_test(acc, n_eval=table.n_eval or 1, classes=table.classes, rules=rules)
                flag = {"failed": ["at_chance"], "undetermined": ["near_chance"]}.get(ct.state, [])
                out[d][arm][s] = (ct.state, float(acc), flag)
    return out


def _resolve(states: _RunStates, reading: str, chance: float) -> _Resolved:
    """``[depth][arm][seed] -> (failed, accuracy entered)`` under one reading (rule 3)."""
    out: _Resolved = {}
    for d, cell in states.items():
        out[d] = {}
        for arm, runs in cell.items():
            out[d][arm] = {}
            for s, (st, v, _) in runs.items():
                failed = st == "failed" or (st == "undetermined" and reading == "at chance")
                out[d][arm][s] = (failed, chance if failed else v)
    return out


def _cell(runs: dict[int, tuple[str, float, list[str]]]) -> str:
    states = {st for st, _, _ in runs.values()}
    if "undetermined" in states:
        return "undetermined"
    return states.pop() if len(states) == 1 else "partial"


def _never_trained(table: DepthScalingTable, states: _RunStates) -> str | None:
    """Rule 2: the no-conclusion sentence, or None when both arms trained somewhere."""
    arms = (table.baseline, table.candidate)
    runs = {a: [st for c in states.values() for st, _, _ in c[a].values()] for a in arms}
    never = [a for a in arms if "trained" not in runs[a]]
    if not never:
        return None
    failed = [a for a in never if all(st == "failed" for st in runs[a])]
    if len(failed) == 2:
        return "no conclusion: both arms failed to train at every depth"
    if len(never) == 2:
        return "no conclusion: neither arm has a run that clearly trained, at any depth"
    if failed:
        return f"no conclusion: the {never[0]} arm failed to train at every depth"
    return (
        f"no conclusion: no run of the {never[0]} arm clearly trained at any depth "
        "(each failed or is undetermined against chance)"
    )


def _slope_quantity(span: int, rules: Rules) -> Quantity:
    """The slope of the advantage over depth, in pp per layer; δ spread over the span."""
    return Quantity(
        name="least-squares slope of test accuracy over depth",
        unit="pp/layer",
        higher_is_better=True,
        smallest_effect=rules.accuracy_pp / span,
        resolution=ACCURACY_RESOLUTION_PP / span,
    )


def profile_items(
    value: Callable[[str, int, int], float],
    depths: list[int],
    seeds: list[int],
    names: tuple[str, str],
    quantities: tuple[Quantity, Quantity, Quantity, Quantity],
    u: float | None = None,
    tag: str = "",
) -> list[Paired]:
    """Level, change, slope and the per-depth comparisons of rule 5, for any per-run value.

    ``value(arm, depth, seed)`` is the number a run enters with; ``names`` is
    ``(candidate, baseline)``; ``quantities`` those of the level, the change, the slope and
    one depth. ``u``, when given, is the variance of one value, propagated to each contrast's
    floor (level ``u/K``, change ``2u``, slope ``u/Σ(d − d̄)²``, one depth ``u``); ``tag``
    names the reading (in the ids and the context).
    """
    cand, base = names
    k, lo, hi = len(depths), depths[0], depths[-1]
    mean_d = math.fsum(depths) / k
    ss = math.fsum((d - mean_d) ** 2 for d in depths)
    weights = {d: (d - mean_d) / ss for d in depths}
    level_q, change_q, slope_q, depth_q = quantities

    def item(cid: str, q: Quantity, f: _PerSeed, var: float | None, scope: str) -> Paired:
        """One contrast: ``f(arm, seed)`` per seed of each arm, paired; ``var`` per value."""
        a, b = ({s: f(arm, s) for s in seeds} for arm in (cand, base))
        v = None if var is None else dict.fromkeys(seeds, var)
        ctx = {"scope": scope, **({"reading": tag} if tag else {})}
        name = cid if not tag else f"{cid} [{tag}]"
        return paired(name, q, a, b, names=(cand, base), var_a=v, var_b=v, context=ctx)

    listed = ", ".join(str(d) for d in depths)
    items = [
        item(
            "level",
            level_q,
            lambda arm, s: math.fsum(value(arm, d, s) for d in depths) / k,
            None if u is None else u / k,
            f"mean over depths {listed}",
        ),
        item(
            "change",
            change_q,
            lambda arm, s: value(arm, hi, s) - value(arm, lo, s),
            None if u is None else 2 * u,
            f"from depth {lo} to depth {hi}",
        ),
        item(
            "slope",
            slope_q,
            lambda arm, s: math.fsum(w * value(arm, d, s) for d, w in weights.items()),
            None if u is None else u / ss,
            f"across depths {listed}",
        ),
    ]
    for d in depths:
        items.append(
            item(f"depth {d}", depth_q, lambda arm, s, d=d: value(arm, d, s), u,
                 f"depth {d}")
        )  # fmt: skip
    return items


def _items(
    table: DepthScalingTable, res: _Resolved, depths: list[int], tag: str, rules: Rules
) -> list[Paired]:
    """Level, change, slope and the per-depth comparisons of one reading (rule 5), in pp."""
    seeds = sorted(res[depths[0]][table.candidate])
    quantities = (
        accuracy("test accuracy", rules),
        accuracy("change in test accuracy with depth", rules),
        _slope_quantity(depths[-1] - depths[0], rules),
        accuracy("test accuracy", rules),
    )
    return profile_items(
        lambda arm, d, s: percent(res[d][arm][s][1]),
        depths,
        seeds,
        (table.candidate, table.baseline),
        quantities,
        accuracy_variance_pp(table.n_eval),
        tag,
    )


def _evidence(
    table: DepthScalingTable, res: _Resolved, depths: list[int], level: float
) -> list[FailureEvidence]:
    """Rule 6: Fisher exact tests where failure counts differ, Holm-decided."""
    rows = []
    for d in depths:
        cell = res[d]
        counts = {arm: sum(f for f, _ in runs.values()) for arm, runs in cell.items()}
        nb, nc = counts[table.baseline], counts[table.candidate]
        if nb == nc:
            continue
        failing = table.candidate if nc > nb else table.baseline
        other = table.baseline if failing == table.candidate else table.candidate
        n_f, n_o = len(cell[failing]), len(cell[other])
        k_f, k_o = counts[failing], counts[other]
        from scipy.stats import fisher_exact  # (scipy.stats: ~0.3 s of import, only here)

        p = float(fisher_exact([[k_f, n_f - k_f], [k_o, n_o - k_o]]).pvalue)
        direction = "against" if failing == table.candidate else "for"
        rows.append((d, direction, failing, (k_f, n_f), (k_o, n_o), p))
    alpha, m = 1.0 - level, len(rows)
    decisive: set[int] = set()
    for k, row in enumerate(sorted(rows, key=lambda r: (r[5], r[0])), start=1):
        if row[5] >= alpha / (m - k + 1):
            break
        decisive.add(row[0])
    return [FailureEvidence(*r, decisive=r[0] in decisive) for r in rows]


def _scenario(
    table: DepthScalingTable, states: _RunStates, reading: str, tag: str, rules: Rules
) -> Scenario:
    """Both answers under one reading of the undetermined runs (rules 4 to 7)."""
    res = _resolve(states, reading, 1.0 / table.classes)
    family = FAMILY if not tag else f"{FAMILY}, undetermined runs {tag}"
    both = [d for d in res if all(f for runs in res[d].values() for f, _ in runs.values())]
    depths = [d for d in res if d not in both]
    if len(depths) < 2:
        why = (
            f"{len(depths)} depth(s) {depths} where an arm did not fail on every seed; "
            "the two questions need at least two"
        )
        return Scenario(tag, family, depths, "no comparison", "no comparison", reason=why)
    items = _items(table, res, depths, tag, rules)
    evidence = _evidence(table, res, depths, rules.level)
    return judged_scenario(tag, family, depths, items, evidence, rules)


def judged_scenario(
    reading: str,
    family: str,
    depths: list[int],
    items: list[Paired],
    evidence: list[FailureEvidence],
    rules: Rules,
) -> Scenario:
    """Rules 5 and 7 on the contrasts of :func:`profile_items`: one Holm family judged, and
    both answers from it (:func:`~fathom.stats.scaling_answers.level_verdict`,
    :func:`~fathom.stats.scaling_answers.trend_verdict`)."""
    comps = judge(family, items, rules)
    level, change, slope = comps[:3]
    per_depth = dict(zip(depths, comps[3:]))
    return Scenario(
        reading=reading,
        family=family,
        depths=depths,
        level=level_verdict(level, per_depth, evidence),
        trend=trend_verdict(change, slope),
        level_contrast=level,
        change=change,
        slope=slope,
        per_depth=per_depth,
        evidence=evidence,
    )


def depth_scaling_verdict(
    table: DepthScalingTable, rules: Rules = DEFAULT_RULES
) -> DepthScalingVerdict:
    """Level and scaling of ``candidate`` against ``baseline`` (module docstring)."""
    why = _bad_table(table)
    if why is not None:
        return DepthScalingVerdict("no comparison", f"no comparison: {why}")
    states = _states(table, rules)
    arms = (table.baseline, table.candidate)
    cells = {d: {arm: _cell(states[d][arm]) for arm in arms} for d in states}
    flagged = [
        FailedRun(d, arm, s, fl)
        for d in states
        for arm in arms
        for s, (st, _, fl) in states[d][arm].items()
        if st != "trained"
    ]
    undetermined = [f for f in flagged if "near_chance" in f.flags]
    out = {
        "cells": cells,
        "excluded": flagged,
        "undetermined": undetermined,
        "observations": observations(cells, list(cells), arms),
    }
    stop = _never_trained(table, states)
    if stop is not None:
        return DepthScalingVerdict("no conclusion", stop, "no conclusion", "no conclusion", **out)
    if undetermined:
        scenarios = [_scenario(table, states, r, r, rules) for r in _READINGS]
    else:
        scenarios = [_scenario(table, states, _READINGS[1], "", rules)]
    if all(s.reason for s in scenarios):
        return no_comparison(scenarios, **out)
    accs = {(f.depth, f.arm, f.seed): states[f.depth][f.arm][f.seed][1] for f in undetermined}
    return assemble(table, scenarios, accs, **out)
