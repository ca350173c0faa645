"""The depth-scaling verdict: does the candidate arm scale with depth better than the baseline?

Input: a table ``rows[depth][arm]`` of per-seed runs (test accuracy, training CE, status).
The rule, applied in this order:

1. **Runs and cells.** A run *failed* when :func:`~fathom.stats.flags.failure_flags`
   excludes it (diverged, incomplete, at chance). A cell (depth, arm) is ``trained`` when
   every seed trained, ``failed`` when every seed failed, ``partial`` otherwise.
2. **No conclusion.** An arm that trained on every seed at no depth gives
   ``"no conclusion: the <arm> arm failed to train at every depth"``: nothing about its
   scaling can be said.
3. **The range.** A scaling claim covers a *contiguous* range of depths starting at the
   shallowest, ``R = d_0 < d_1 < ... < d_k``: the longest prefix of the sorted depths at
   which both arms trained. It never jumps over a depth where an arm failed; every depth
   outside ``R`` is named with its reason (which arm failed, how many seeds, which flags;
   or that it lies beyond the depth where the range stops).
4. **Failure evidence.** A depth where only the candidate fails (candidate ``failed`` or
   ``partial``, baseline ``trained``) is evidence *against* the candidate; a depth where only
   the baseline fails is evidence *for* it. Evidence at a depth is *decisive* when the
   two-sided Fisher exact test on the failure counts (failed / trained seeds of each arm)
   gives ``p < 1 - level``. All seeds failing against all training needs 5 seeds per arm
   at level 0.95 (``p = 2 / C(2n, n)``: 0.10 for n = 3, 0.0079 for n = 5); one seed is
   never decisive. Non-decisive evidence still blocks any claim in the other direction.
5. **The interval.** Over ``R`` (``k >= 1``), per seed ``s`` common to the four cells::

       Δ_s = (cand(d_k) - cand(d_0)) - (base(d_k) - base(d_0))

   with a paired Student-t interval at ``level``: ``low > 0`` supports "better",
   ``high < 0`` "worse". With n < 2 seeds there is no interval, hence no interval-based claim.
6. **Combination.** Decisive evidence in both directions: ``"inconclusive"`` (conflicting).
   Decisive evidence in one direction: that claim, whatever the slope over ``R``: an arm that
   does not train where the other does scales worse. Otherwise an interval that excludes zero
   gives its claim unless failure evidence points the other way (then ``"inconclusive"``); an
   interval containing zero gives ``"not established"``; no interval gives ``"inconclusive"``.

The sentence names the range, the excluded depths and why, and says when the candidate is
better (or worse) at every depth of the range (per-depth paired intervals).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from scipy.stats import fisher_exact

from fathom.stats.flags import failure_flags, is_excluded
from fathom.stats.intervals import Interval, paired_difference
from fathom.stats.scaling_sentences import combine, observations
from fathom.stats.scaling_table import (
    ArmRuns,
    DepthScalingTable,
    DepthScalingVerdict,
    FailedRun,
    FailureEvidence,
    validate_table,
)
from fathom.stats.verdicts import Verdict, compare

__all__ = [
    "ArmRuns",
    "DepthScalingTable",
    "DepthScalingVerdict",
    "FailedRun",
    "FailureEvidence",
    "depth_scaling_verdict",
]


@dataclass(frozen=True)
class _Cell:
    state: str
    n: int
    n_failed: int
    flag_counts: dict[str, int]

    def describe(self, arm: str) -> str:
        flags = ", ".join(f"{f} {k}/{self.n}" for f, k in sorted(self.flag_counts.items()))
        if self.state == "trained":
            return f"{arm} trained ({self.n}/{self.n} seeds)"
        return f"{arm} failed on {self.n_failed}/{self.n} seeds ({flags})"


def _classify(table: DepthScalingTable) -> tuple[dict[int, dict[str, _Cell]], list[FailedRun]]:
    out: dict[int, dict[str, _Cell]] = {}
    excluded: list[FailedRun] = []
    for d in sorted(table.rows):
        out[d] = {}
        for arm in (table.baseline, table.candidate):
            runs = table.rows[d][arm]
            flags = [
                failure_flags(status=st, test_acc=acc, train_ce=ce, classes=table.classes)
                for acc, ce, st in zip(runs.test_acc, runs.ce_list(), runs.status)
            ]
            counts: Counter[str] = Counter()
            for seed, fl in zip(runs.seed_ids(), flags):
                if is_excluded(fl):
                    excluded.append(FailedRun(d, arm, seed, fl))
                    counts.update(f for f in fl if f != "not_fitting")
            n_failed = sum(is_excluded(fl) for fl in flags)
            state = (
                "trained" if n_failed == 0 else "failed" if n_failed == len(flags) else "partial"
            )
            out[d][arm] = _Cell(state, len(flags), n_failed, dict(counts))
    return out, excluded


def _by_seed(runs: ArmRuns) -> dict[int, float]:
    return {s: float(a) for s, a in zip(runs.seed_ids(), runs.test_acc) if a is not None}


def _per_depth(
    table: DepthScalingTable, cells: dict[int, dict[str, _Cell]], level: float
) -> dict[int, Verdict]:
    """Candidate against baseline at each depth (paired over seeds); no comparison if one failed."""
    out: dict[int, Verdict] = {}
    for d, cell in cells.items():
        not_trained = [arm for arm, c in cell.items() if c.state != "trained"]
        if not_trained:
            reason = "; ".join(f"{arm} {cell[arm].state} at depth {d}" for arm in not_trained)
            out[d] = Verdict("no comparison", reason, None)
            continue
        diff = paired_difference(
            _by_seed(table.rows[d][table.candidate]), _by_seed(table.rows[d][table.baseline]), level
        )
        out[d] = compare(
            diff,
            higher_is_better=True,
            flags_a=[],
            flags_b=[],
            name_a=table.candidate,
            name_b=table.baseline,
        )
    return out


def _evidence(
    table: DepthScalingTable, cells: dict[int, dict[str, _Cell]], level: float
) -> list[FailureEvidence]:
    """Depths where exactly one arm failed, with the Fisher exact test on the failure counts."""
    out = []
    for d, cell in cells.items():
        base, cand = cell[table.baseline], cell[table.candidate]
        if (base.state == "trained") == (cand.state == "trained"):
            continue
        failing, other = (cand, base) if base.state == "trained" else (base, cand)
        direction = "against" if failing is cand else "for"
        arm = table.candidate if failing is cand else table.baseline
        counts = [[failing.n_failed, failing.n - failing.n_failed], [0, other.n]]
        p = float(fisher_exact(counts).pvalue)
        out.append(
            FailureEvidence(
                d, direction, arm, (failing.n_failed, failing.n), (0, other.n), p, p < 1 - level
            )
        )
    return out


def _excluded_depths(
    table: DepthScalingTable, cells: dict[int, dict[str, _Cell]], span: list[int]
) -> dict[int, str]:
    """Why each depth outside the contiguous range ``span`` is excluded from the interval."""
    stop = next((d for d in cells if d not in span), None)
    out = {}
    for d, cell in cells.items():
        if d in span:
            continue
        failing = [arm for arm, c in cell.items() if c.state != "trained"]
        if failing:
            out[d] = "; ".join(cell[arm].describe(arm) for arm in (table.candidate, table.baseline))
        else:
            out[d] = (
                f"both trained, but beyond depth {stop} where the range stops (a claim does not "
                "jump over a failed depth)"
            )
    return out


def _scaling_interval(table: DepthScalingTable, span: list[int], level: float) -> Interval | None:
    """Paired interval of Δ_s over the range (rule 5); None without 2 depths or a common seed."""
    if len(span) < 2:
        return None
    d0, d1 = span[0], span[-1]

    def change(arm: str) -> dict[int, float]:
        lo, hi = _by_seed(table.rows[d0][arm]), _by_seed(table.rows[d1][arm])
        return {s: hi[s] - lo[s] for s in sorted(set(lo) & set(hi))}

    cand, base = change(table.candidate), change(table.baseline)
    if not set(cand) & set(base):
        return None
    return paired_difference(cand, base, level)


def _never_trained(table: DepthScalingTable, cells: dict[int, dict[str, _Cell]]) -> str | None:
    """Rule 2: the no-conclusion sentence, or None when both arms trained somewhere."""
    arms = (table.baseline, table.candidate)
    never = [a for a in arms if all(c[a].state != "trained" for c in cells.values())]
    if not never:
        return None
    all_failed = [a for a in never if all(c[a].state == "failed" for c in cells.values())]
    if len(never) == 2:
        if len(all_failed) == 2:
            return "no conclusion: both arms failed to train at every depth"
        return "no conclusion: neither arm trained on every seed at any depth"
    if all_failed:
        return f"no conclusion: the {never[0]} arm failed to train at every depth"
    return (
        f"no conclusion: the {never[0]} arm trained on every seed at no depth "
        "(some seeds failed everywhere)"
    )


def depth_scaling_verdict(table: DepthScalingTable, level: float = 0.95) -> DepthScalingVerdict:
    """Conclusion about depth scaling of ``candidate`` against ``baseline`` (module docstring)."""
    validate_table(table)
    cells, excluded = _classify(table)
    states = {d: {arm: c.state for arm, c in cell.items()} for d, cell in cells.items()}
    depths = list(cells)
    notes = observations(states, depths, (table.baseline, table.candidate))
    per_depth = _per_depth(table, cells, level)
    span: list[int] = []
    for d in depths:
        if any(c.state != "trained" for c in cells[d].values()):
            break
        span.append(d)
    evidence = _evidence(table, cells, level)
    out = {
        "cells": states,
        "excluded": excluded,
        "per_depth": per_depth,
        "observations": notes,
        "excluded_depths": _excluded_depths(table, cells, span),
        "evidence": evidence,
        "depth_range": (span[0], span[-1]) if len(span) >= 2 else None,
    }
    stop = _never_trained(table, cells)
    if stop is not None:
        return DepthScalingVerdict(stop.split(":")[0], stop, scaling=None, **out)
    scaling = _scaling_interval(table, span, level)
    verdict, sentence = combine(table, span, scaling, per_depth, evidence, out["excluded_depths"])
    return DepthScalingVerdict(verdict, sentence, scaling=scaling, **out)
