"""Computed verdicts: every sentence that compares methods is produced here.

A comparison of arm ``a`` against arm ``b`` is read off the interval of the paired
difference ``d = a - b`` (see :mod:`fathom.stats.intervals`)::

    better           low > 0  (or high < 0 when lower is better)
    worse            high < 0 (or low > 0 when lower is better)
    not established  the interval contains 0, or n < 2 so there is no interval
    no comparison    an arm carries an excluding failure flag (diverged, at chance,
                     incomplete); the arm is listed, never ranked

The depth-scaling verdict of the depth benchmark applies the same rules per depth and
to the change of accuracy with depth, using only depths at which an arm trained.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fathom.errors import FathomError
from fathom.stats.flags import EXCLUDING_FLAGS, failure_flags, is_excluded
from fathom.stats.intervals import Interval, paired_difference

VERDICTS = ("better", "worse", "not established", "no comparison")


@dataclass(frozen=True)
class Verdict:
    """The outcome of one comparison: one of :data:`VERDICTS`, why, and its interval."""

    verdict: str
    reason: str
    diff: Interval | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "diff": None if self.diff is None else self.diff.to_dict(),
        }


def _fmt(x: float | None, digits: int = 4) -> str:
    return "null" if x is None else f"{x:+.{digits}f}"


def _interval_text(diff: Interval, digits: int = 4) -> str:
    if not diff.has_interval:
        return f"n={diff.n}, no interval"
    pct = f"{100 * diff.level:g}%"
    return f"{pct} {diff.method} interval [{_fmt(diff.low, digits)}, {_fmt(diff.high, digits)}], n={diff.n}"


def _excluding(flags: Sequence[str]) -> list[str]:
    return sorted({f for f in flags if f in EXCLUDING_FLAGS})


def compare(
    diff: Interval | None,
    *,
    higher_is_better: bool,
    flags_a: Sequence[str],
    flags_b: Sequence[str],
    name_a: str = "a",
    name_b: str = "b",
) -> Verdict:
    """Verdict of ``a`` against ``b`` from the paired difference ``diff = a - b``.

    ``flags_a`` / ``flags_b`` are the failure flags of each arm's runs (their union over
    seeds). An excluding flag on either arm gives ``"no comparison"``; ``not_fitting``
    is kept as a caveat in the reason. ``diff`` may be ``None`` only when an arm is
    excluded (no difference could be formed).
    """
    bad = [(name, _excluding(flags)) for name, flags in ((name_a, flags_a), (name_b, flags_b))]
    bad = [(name, fl) for name, fl in bad if fl]
    if bad:
        listed = "; ".join(f"{name} excluded ({', '.join(fl)})" for name, fl in bad)
        return Verdict("no comparison", listed, diff)
    if diff is None:
        raise FathomError(
            "compare: no difference interval given for two arms without excluding flags; "
            "pass paired_difference(a, b)"
        )
    caveats = [
        f"caveat: {name} not fitting"
        for name, flags in ((name_a, flags_a), (name_b, flags_b))
        if "not_fitting" in flags
    ]
    if not diff.has_interval:
        verdict, why = "not established", f"n={diff.n} paired seed(s): no interval"
    elif diff.low > 0 or diff.high < 0:
        a_higher = diff.low > 0
        verdict = "better" if a_higher == higher_is_better else "worse"
        why = f"the interval excludes zero ({_interval_text(diff)})"
    else:
        verdict, why = "not established", f"the interval includes zero ({_interval_text(diff)})"
    return Verdict(verdict, "; ".join([why, *caveats]), diff)


def verdict_sentence(
    verdict: Verdict, *, name_a: str, name_b: str, metric: str, digits: int = 4
) -> str:
    """The one sentence a report prints for a comparison of ``name_a`` against ``name_b``.

    Examples::

        "SD-constant vs plain on test accuracy: better (difference +0.0031, 95% paired t
         interval [+0.0012, +0.0050], n=3)."
        "SD-constant vs plain on test accuracy: not established (the interval includes zero ...)."
        "SD-constant vs plain on test accuracy: no comparison (plain excluded (diverged))."
    """
    head = f"{name_a} vs {name_b} on {metric}: {verdict.verdict}"
    if verdict.verdict in ("better", "worse"):
        assert verdict.diff is not None
        body = f"difference {_fmt(verdict.diff.estimate, digits)}, {_interval_text(verdict.diff, digits)}"
        caveats = [part for part in verdict.reason.split("; ") if part.startswith("caveat")]
        return f"{head} ({'; '.join([body, *caveats])})."
    if verdict.verdict == "not established" and verdict.diff is not None:
        return f"{head} (difference {_fmt(verdict.diff.estimate, digits)}; {verdict.reason})."
    return f"{head} ({verdict.reason})."


@dataclass(frozen=True)
class RankComparison:
    """Ranking of arms at the selected and the final checkpoints, side by side."""

    selected_order: list[str]
    final_order: list[str]
    disagree: bool
    rows: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


def _order(values: Mapping[str, float], higher_is_better: bool) -> list[str]:
    sign = -1.0 if higher_is_better else 1.0
    return sorted(values, key=lambda name: (sign * values[name], name))


def rank_disagreement(
    selected: Mapping[str, float],
    final: Mapping[str, float],
    *,
    higher_is_better: bool = True,
) -> RankComparison:
    """Rank arms by their value at the selected and at the final checkpoint.

    ``disagree`` is True when the two orders differ; reports must then show ``rows``
    (name, value and rank at each checkpoint) side by side. Ties are broken by name.
    """
    if set(selected) != set(final):
        raise FathomError(
            f"rank_disagreement: arms differ between selected {sorted(selected)} and final "
            f"{sorted(final)}; pass the same arms at both checkpoints"
        )
    for where, values in (("selected", selected), ("final", final)):
        for name, v in values.items():
            if v is None or not math.isfinite(v):
                raise FathomError(
                    f"rank_disagreement: {where} value of {name!r} is {v!r}; rank only arms "
                    "that were not excluded by their failure flags"
                )
    sel_order = _order(selected, higher_is_better)
    fin_order = _order(final, higher_is_better)
    rows = [
        {
            "name": name,
            "selected": selected[name],
            "selected_rank": sel_order.index(name) + 1,
            "final": final[name],
            "final_rank": fin_order.index(name) + 1,
        }
        for name in sel_order
    ]
    return RankComparison(sel_order, fin_order, sel_order != fin_order, rows)


def first_crossing(
    times: Sequence[float], values: Sequence[float | None], target: float
) -> float | None:
    """First observed time at which ``value >= target``; ``None`` if never observed.

    Values exist only at evaluation epochs, so the true crossing lies between the
    previous evaluation time and the returned one: the evaluation cadence bounds the
    precision (with evaluation every 5 epochs the answer can be up to 5 epochs late).
    ``None`` values (not evaluated) are skipped; times must be non-decreasing.
    """
    if len(times) != len(values):
        raise FathomError(
            f"first_crossing: {len(times)} times but {len(values)} values; pass one time per value"
        )
    if any(t1 < t0 for t0, t1 in itertools.pairwise(times)):
        raise FathomError("first_crossing: times decrease; pass them in the order observed")
    for t, v in zip(times, values):
        if v is not None and math.isfinite(v) and v >= target:
            return float(t)
    return None


# ----------------------------------------------------------------------------------------
# Depth scaling (issue 7)


@dataclass(frozen=True)
class ArmRuns:
    """One arm at one depth: per-seed test accuracy, training CE and run status.

    ``seeds`` pairs runs across arms and depths; when ``None`` the list position is the
    seed (0, 1, ...), so every list must then be in the same seed order everywhere.
    ``train_ce`` entries may be ``None`` (not recorded).
    """

    test_acc: list[float | None]
    status: list[str]
    train_ce: list[float | None] | None = None
    seeds: list[int] | None = None

    def seed_ids(self) -> list[int]:
        """The seeds of the runs, positional when not given."""
        return list(self.seeds) if self.seeds is not None else list(range(len(self.test_acc)))

    def ce_list(self) -> list[float | None]:
        """Training CE per run (``None`` where not recorded)."""
        return list(self.train_ce) if self.train_ce is not None else [None] * len(self.test_acc)


@dataclass(frozen=True)
class DepthScalingTable:
    """Results of the depth benchmark: ``rows[depth][arm] -> ArmRuns``.

    ``baseline`` and ``candidate`` name the two arms (e.g. ``"vanilla"`` and
    ``"Lyapunov"``); ``classes`` is the number of classes of the data set (chance is
    ``1 / classes``).
    """

    classes: int
    baseline: str
    candidate: str
    rows: dict[int, dict[str, ArmRuns]]
    dataset: str = ""


@dataclass(frozen=True)
class FailedRun:
    """A run excluded from the depth-scaling claims, with its flags."""

    depth: int
    arm: str
    seed: int
    flags: list[str]


@dataclass(frozen=True)
class DepthScalingVerdict:
    """The computed depth-scaling conclusion.

    ``verdict``: ``"better scaling"`` / ``"worse scaling"`` (for the candidate against
    the baseline), ``"not established"``, ``"inconclusive"`` or ``"no conclusion"``.
    ``cells[depth][arm]`` is ``"trained"``, ``"failed"`` or ``"partial"`` (some seeds
    failed; partial cells are not used for claims). ``scaling`` is the interval of the
    paired difference of accuracy changes between the shallowest and deepest depths at
    which both arms trained.
    """

    verdict: str
    sentence: str
    cells: dict[int, dict[str, str]]
    excluded: list[FailedRun]
    per_depth: dict[int, Verdict]
    scaling: Interval | None
    depth_range: tuple[int, int] | None
    observations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (depth keys become strings)."""
        return {
            "verdict": self.verdict,
            "sentence": self.sentence,
            "cells": {str(d): dict(c) for d, c in self.cells.items()},
            "excluded": [asdict(f) for f in self.excluded],
            "per_depth": {str(d): v.to_dict() for d, v in self.per_depth.items()},
            "scaling": None if self.scaling is None else self.scaling.to_dict(),
            "depth_range": None if self.depth_range is None else list(self.depth_range),
            "observations": list(self.observations),
        }


def _validate_table(table: DepthScalingTable) -> None:
    arms = (table.baseline, table.candidate)
    if table.baseline == table.candidate:
        raise FathomError(f"depth table: baseline and candidate are both {table.baseline!r}")
    if not table.rows:
        raise FathomError("depth table has no depths; add at least one row")
    for depth, cells in table.rows.items():
        missing = [a for a in arms if a not in cells]
        if missing:
            raise FathomError(
                f"depth table: depth {depth} lacks arm(s) {missing} (has {sorted(cells)}); "
                "give both arms at every depth, with status 'failed' for runs that did not run"
            )
        for arm in arms:
            runs = cells[arm]
            n = len(runs.test_acc)
            lengths = {
                "status": len(runs.status),
                "train_ce": len(runs.ce_list()),
                "seeds": len(runs.seed_ids()),
            }
            bad = {k: v for k, v in lengths.items() if v != n}
            if n == 0 or bad:
                raise FathomError(
                    f"depth table: depth {depth}, arm {arm!r} has {n} test accuracies but "
                    f"{bad or 'no runs'}; give one entry per seed in every list"
                )
            if len(set(runs.seed_ids())) != n:
                raise FathomError(
                    f"depth table: depth {depth}, arm {arm!r} repeats a seed {runs.seed_ids()}"
                )


def _run_flags(table: DepthScalingTable, runs: ArmRuns) -> list[list[str]]:
    return [
        failure_flags(status=st, test_acc=acc, train_ce=ce, classes=table.classes)
        for acc, ce, st in zip(runs.test_acc, runs.ce_list(), runs.status)
    ]


def _by_seed(runs: ArmRuns) -> dict[int, float]:
    return {s: float(a) for s, a in zip(runs.seed_ids(), runs.test_acc) if a is not None}


def depth_scaling_verdict(table: DepthScalingTable, level: float = 0.95) -> DepthScalingVerdict:
    """Conclusion about depth scaling of ``candidate`` against ``baseline``.

    Rules (issue 7):

    1. A run FAILED when it diverged, did not complete, its test accuracy is below
       twice chance, or its training CE is near ln C (:func:`failure_flags`).
    2. A cell (depth, arm) is used only when every seed trained; failed runs are listed.
    3. An arm that trained at no depth gives ``"no conclusion: the <arm> arm failed to
       train at every depth"``: no claim about scaling is made.
    4. The scaling statistic uses only depths where both arms trained, from the
       shallowest ``d0`` to the deepest ``d1``: per seed
       ``Δ = (cand(d1) - cand(d0)) - (base(d1) - base(d0))``, with a paired t interval.
       Fewer than two such depths, or fewer than two seeds common to the four cells,
       gives ``"inconclusive"`` with the reason.
    """
    _validate_table(table)
    arms = (table.baseline, table.candidate)
    depths = sorted(table.rows)
    cells: dict[int, dict[str, str]] = {}
    excluded: list[FailedRun] = []
    for d in depths:
        cells[d] = {}
        for arm in arms:
            runs = table.rows[d][arm]
            flags = _run_flags(table, runs)
            for seed, fl in zip(runs.seed_ids(), flags):
                if is_excluded(fl):
                    excluded.append(FailedRun(d, arm, seed, fl))
            n_failed = sum(is_excluded(fl) for fl in flags)
            cells[d][arm] = (
                "trained" if n_failed == 0 else "failed" if n_failed == len(flags) else "partial"
            )

    trained = {arm: [d for d in depths if cells[d][arm] == "trained"] for arm in arms}
    observations = _observations(cells, depths, arms)

    per_depth: dict[int, Verdict] = {}
    for d in depths:
        not_trained = [arm for arm in arms if cells[d][arm] != "trained"]
        if not_trained:
            reason = "; ".join(f"{arm} {cells[d][arm]} at depth {d}" for arm in not_trained)
            per_depth[d] = Verdict("no comparison", reason, None)
            continue
        diff = paired_difference(
            _by_seed(table.rows[d][table.candidate]), _by_seed(table.rows[d][table.baseline]), level
        )
        per_depth[d] = compare(
            diff,
            higher_is_better=True,
            flags_a=[],
            flags_b=[],
            name_a=table.candidate,
            name_b=table.baseline,
        )

    def result(
        verdict: str,
        sentence: str,
        scaling: Interval | None = None,
        rng: tuple[int, int] | None = None,
    ) -> DepthScalingVerdict:
        return DepthScalingVerdict(
            verdict, sentence, cells, excluded, per_depth, scaling, rng, observations
        )

    never = [arm for arm in arms if not trained[arm]]
    if never:
        all_failed = [arm for arm in never if all(cells[d][arm] == "failed" for d in depths)]
        if len(never) == 2:
            what = (
                "both arms failed to train at every depth"
                if len(all_failed) == 2
                else "neither arm trained on every seed at any depth"
            )
            return result("no conclusion", f"no conclusion: {what}")
        arm = never[0]
        what = (
            f"the {arm} arm failed to train at every depth"
            if all_failed
            else f"the {arm} arm trained on every seed at no depth (some seeds failed everywhere)"
        )
        return result("no conclusion", f"no conclusion: {what}")

    common = [d for d in depths if d in trained[table.baseline] and d in trained[table.candidate]]
    if len(common) < 2:
        where = f"depth {common[0]}" if common else "no depth"
        return result(
            "inconclusive",
            f"inconclusive: both arms trained together at {where}; a depth-scaling claim "
            "needs at least two depths where both arms trained",
        )
    d0, d1 = common[0], common[-1]

    def change(arm: str) -> dict[int, float]:
        lo, hi = _by_seed(table.rows[d0][arm]), _by_seed(table.rows[d1][arm])
        return {s: hi[s] - lo[s] for s in sorted(set(lo) & set(hi))}

    cand_change, base_change = change(table.candidate), change(table.baseline)
    if len(set(cand_change) & set(base_change)) == 0:
        return result(
            "inconclusive",
            f"inconclusive: no seed is common to both arms at depths {d0} and {d1}",
            rng=(d0, d1),
        )
    scaling = paired_difference(cand_change, base_change, level)
    v = compare(
        scaling,
        higher_is_better=True,
        flags_a=[],
        flags_b=[],
        name_a=table.candidate,
        name_b=table.baseline,
    )
    span = f"from depth {d0} to {d1}"
    delta = f"accuracy change {table.candidate} minus {table.baseline} {_fmt(scaling.estimate)}"
    if not scaling.has_interval:
        return result(
            "inconclusive",
            f"inconclusive: {span}, {delta} from n={scaling.n} seed; at least 2 seeds are "
            "needed for an interval",
            scaling,
            (d0, d1),
        )
    if v.verdict == "not established":
        return result(
            "not established",
            f"not established: {span}, {delta}, {_interval_text(scaling)} includes zero",
            scaling,
            (d0, d1),
        )
    word = "better" if v.verdict == "better" else "worse"
    return result(
        f"{word} scaling",
        f"{word} scaling: the {table.candidate} arm scales {word} than {table.baseline} "
        f"{span} ({delta}, {_interval_text(scaling)})",
        scaling,
        (d0, d1),
    )


def _observations(
    cells: dict[int, dict[str, str]], depths: list[int], arms: tuple[str, str]
) -> list[str]:
    """Factual notes on where each arm trained (no comparison of quality)."""
    notes = []
    for arm in arms:
        failed = [d for d in depths if cells[d][arm] == "failed"]
        partial = [d for d in depths if cells[d][arm] == "partial"]
        if failed:
            notes.append(f"{arm} failed to train at depth(s) {failed}")
        if partial:
            notes.append(f"{arm} failed on some seeds at depth(s) {partial}")
    for arm, other in (arms, arms[::-1]):
        only = [d for d in depths if cells[d][arm] == "trained" and cells[d][other] == "failed"]
        if only:
            notes.append(f"only {arm} trained at depth(s) {only}")
    return notes
