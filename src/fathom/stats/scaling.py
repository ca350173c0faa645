"""The depth-scaling verdict: does the candidate arm scale with depth better than the baseline?

Input: a table ``rows[depth][arm]`` of per-seed runs (test accuracy on ``n_eval`` examples
of ``classes`` classes, status). The rule (``docs/statistics.md``), in order:

1. **Bad input** (:func:`~fathom.stats.scaling_table.bad_table`: one depth, one class, no
   test-set size, unequal or missing seeds, an incomplete run, a non-finite accuracy of a
   run that did not diverge) gives ``no comparison`` naming the reason.
2. **Runs.** Each run is *trained*, *failed* or *undetermined* against chance
   (:func:`fathom.stats.chance.chance_test`); a diverged run failed, and enters the
   profile at chance accuracy ``1/C`` (failure is an observed low accuracy, never an
   exclusion). An arm with no trained run at any depth: ``no conclusion`` (nothing about
   its scaling can be said; seed 000's table, the regularized arm at 1% everywhere).
3. **Determined depths** ``D``: depths where no run of either arm is undetermined. A depth
   with an undetermined run is left out of everything below and named: an undetermined
   cell never decides a verdict. Fewer than two determined depths: ``no comparison``.
4. **The profile contrast**, paired over seeds (accuracy in pp)::

       Δ_s = (1/|D|) Σ_{d ∈ D} (cand_s(d) − base_s(d))

   judged by :mod:`fathom.stats.inference` (floor: the binomial bound of each accuracy,
   ``v_s = (1/|D|²) Σ_d (u_cand + u_base)``; smallest effect ``rules.accuracy_pp``), in one
   Holm family with the per-depth paired comparisons at every depth of ``D``.
5. **Failure evidence**: at each depth where the arms' failure counts differ, the two-sided
   Fisher exact test; *decisive* when Holm over those depths rejects at the nominal level.
6. **Combination.** The profile's verdict gives ``better`` / ``worse`` / ``equivalent
   scaling`` unless an established per-depth comparison or decisive failure evidence points
   the other way (for *equivalent*: any way): then ``inconclusive``, naming both. An
   established verdict that leave-one-seed-out reverses is marked ``fragile``. Otherwise
   ``not established``.
"""

from __future__ import annotations

import math

from scipy.stats import fisher_exact

from fathom.stats.chance import chance_test
from fathom.stats.inference import Paired, judge, paired
from fathom.stats.quantities import accuracy, accuracy_variance_pp
from fathom.stats.results import Comparison
from fathom.stats.rules import DEFAULT_RULES, Rules
from fathom.stats.scaling_sentences import combine, observations
from fathom.stats.scaling_table import (
    DepthScalingTable,
    DepthScalingVerdict,
    FailedRun,
    FailureEvidence,
    bad_table,
)
from fathom.units import fmt_value, percent

FAMILY = "depth scaling"

RunStates = dict[int, dict[str, dict[int, tuple[str, float, list[str]]]]]


def _states(table: DepthScalingTable, rules: Rules) -> RunStates:
    """``[depth][arm][seed] -> (state, accuracy used, flags)`` (rule 2)."""
    out: RunStates = {}
    for d in sorted(table.rows):
        out[d] = {}
        for arm in (table.baseline, table.candidate):
            runs = table.rows[d][arm]
            out[d][arm] = {}
            for s, acc, st in zip(runs.seed_ids(), runs.test_acc, runs.status):
                finite = acc is not None and math.isfinite(float(acc))
                if st == "diverged" or not finite:
                    out[d][arm][s] = ("failed", 1.0 / table.classes, ["diverged"])
                    continue
                ct = chance_test(acc, n_eval=table.n_eval or 1, classes=table.classes, rules=rules)
                flag = {"failed": ["at_chance"], "undetermined": ["near_chance"]}.get(ct.state, [])
                out[d][arm][s] = (ct.state, float(acc), flag)  # type: ignore[arg-type]
    return out


def _cell(runs: dict[int, tuple[str, float, list[str]]]) -> str:
    states = {st for st, _, _ in runs.values()}
    if "undetermined" in states:
        return "undetermined"
    return states.pop() if len(states) == 1 else "partial"


def _never_trained(table: DepthScalingTable, states: RunStates) -> str | None:
    """Rule 2: the no-conclusion sentence, or None when both arms trained somewhere."""
    arms = (table.baseline, table.candidate)
    never = [
        a
        for a in arms
        if all(st != "trained" for c in states.values() for st, _, _ in c[a].values())
    ]
    if not never:
        return None
    failed = [
        a
        for a in never
        if all(st == "failed" for c in states.values() for st, _, _ in c[a].values())
    ]
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


def _items(table: DepthScalingTable, states: RunStates, determined: list[int]) -> list[Paired]:
    """The profile contrast and the per-depth comparisons (rule 4), in one family."""
    q = accuracy("test accuracy")
    u = accuracy_variance_pp(table.n_eval)
    cand, base = table.candidate, table.baseline
    names = (cand, base)

    def pp(d: int, arm: str) -> dict[int, float]:
        return {s: percent(v) for s, (_, v, _) in states[d][arm].items()}  # type: ignore[misc]

    seeds = sorted(states[determined[0]][cand])
    k = len(determined)
    prof_c = {s: math.fsum(pp(d, cand)[s] for d in determined) / k for s in seeds}
    prof_b = {s: math.fsum(pp(d, base)[s] for d in determined) / k for s in seeds}
    var = {s: u / k for s in seeds}
    depths = ", ".join(str(d) for d in determined)
    items = [
        paired(
            "profile",
            q,
            prof_c,
            prof_b,
            names=names,
            var_a=var,
            var_b=var,
            context={"scope": f"mean over depths {depths}"},
        )
    ]
    for d in determined:
        v = {s: u for s in seeds}
        items.append(
            paired(
                f"depth {d}",
                q,
                pp(d, cand),
                pp(d, base),
                names=names,
                var_a=v,
                var_b=v,
                context={"scope": f"depth {d}"},
            )
        )
    return items


def _evidence(table: DepthScalingTable, states: RunStates, level: float) -> list[FailureEvidence]:
    """Rule 5: Fisher exact tests where failure counts differ, Holm-decided."""
    rows = []
    for d, cell in states.items():
        counts = {
            arm: sum(st == "failed" for st, _, _ in runs.values()) for arm, runs in cell.items()
        }
        nb, nc = counts[table.baseline], counts[table.candidate]
        if nb == nc or any(st == "undetermined" for r in cell.values() for st, _, _ in r.values()):
            continue
        failing = table.candidate if nc > nb else table.baseline
        other = table.baseline if failing == table.candidate else table.candidate
        n_f, n_o = len(cell[failing]), len(cell[other])
        k_f, k_o = counts[failing], counts[other]
        p = float(fisher_exact([[k_f, n_f - k_f], [k_o, n_o - k_o]]).pvalue)
        rows.append(
            (
                d,
                "against" if failing == table.candidate else "for",
                failing,
                (k_f, n_f),
                (k_o, n_o),
                p,
            )
        )
    alpha, m = 1.0 - level, len(rows)
    decisive: set[int] = set()
    for k, row in enumerate(sorted(rows, key=lambda r: (r[5], r[0])), start=1):
        if row[5] >= alpha / (m - k + 1):
            break
        decisive.add(row[0])
    return [FailureEvidence(*r, decisive=r[0] in decisive) for r in rows]


def depth_scaling_verdict(
    table: DepthScalingTable, rules: Rules = DEFAULT_RULES
) -> DepthScalingVerdict:
    """Conclusion about depth scaling of ``candidate`` against ``baseline`` (module docstring)."""
    why = bad_table(table)
    if why is not None:
        blank = _blank(table, list(table.rows), why)
        return DepthScalingVerdict("no comparison", f"no comparison: {why}", per_depth=blank)
    states = _states(table, rules)
    arms = (table.baseline, table.candidate)
    cells = {d: {arm: _cell(states[d][arm]) for arm in arms} for d in states}
    excluded = [
        FailedRun(d, arm, s, fl)
        for d in states
        for arm in arms
        for s, (st, _, fl) in states[d][arm].items()
        if st != "trained"
    ]
    determined = [d for d in states if "undetermined" not in cells[d].values()]
    out = {
        "cells": cells,
        "excluded": excluded,
        "determined": determined,
        "observations": observations(cells, list(cells), arms),
        "excluded_depths": {
            d: _undetermined_text(table, states[d]) for d in states if d not in determined
        },
    }
    stop = _never_trained(table, states)
    if stop is not None:
        blank = _blank(table, list(states), stop.split(": ", 1)[1])
        return DepthScalingVerdict(stop.split(":")[0], stop, per_depth=blank, **out)
    if len(determined) < 2:
        why = (
            f"{len(determined)} determined depth(s) {determined}; a depth profile needs at "
            "least two (undetermined runs decide nothing)"
        )
        blank = _blank(table, list(states), why)
        return DepthScalingVerdict("no comparison", f"no comparison: {why}", per_depth=blank, **out)
    comps = judge(FAMILY, _items(table, states, determined), rules)
    evidence = _evidence(table, states, rules.level)
    profile, per_depth = comps[0], {d: c for d, c in zip(determined, comps[1:])}
    for d, why in out["excluded_depths"].items():
        blank = _blank(table, [d], why)[d]
        per_depth[d] = blank.model_copy(update={"family_size": profile.family_size})
    per_depth = dict(sorted(per_depth.items()))
    verdict, sentence, results = combine(
        table, profile, per_depth, evidence, out["excluded_depths"]
    )
    return DepthScalingVerdict(
        verdict,
        sentence,
        per_depth=per_depth,
        profile=profile,
        evidence=evidence,
        fragile=profile.fragile and verdict.endswith("scaling"),
        results=results,
        **out,
    )


def _undetermined_text(table: DepthScalingTable, cell: dict[str, dict]) -> str:
    """Which runs are undetermined at a depth (named with their accuracy)."""
    parts = []
    for arm in (table.candidate, table.baseline):
        runs = [(s, v) for s, (st, v, _) in cell[arm].items() if st == "undetermined"]
        if runs:
            accs = ", ".join(fmt_value(percent(v), "%") for _, v in runs)
            parts.append(f"{arm} seed(s) {[s for s, _ in runs]} ({accs})")
    return f"undetermined against chance: {'; '.join(parts)}"


def _blank(table: DepthScalingTable, depths: list[int], why: str) -> dict[int, Comparison]:
    """``no comparison`` at each of ``depths``, naming ``why`` (every depth keeps an entry)."""
    q = accuracy("test accuracy")
    return {
        d: Comparison(
            id=f"depth {d}",
            family=FAMILY,
            quantity=q,
            a=table.candidate,
            b=table.baseline,
            verdict="no comparison",
            reason=why,
            context={"scope": f"depth {d}"},
        )
        for d in sorted(depths)
    }
