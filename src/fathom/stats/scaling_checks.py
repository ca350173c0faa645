"""The input checks of the depth-scaling verdict: a table no rule can judge is refused,
naming the problem and its fix (``no comparison: …``), never an exception or a verdict.

Refused: counts that are not integers (classes, test-set size), depth keys or seeds that
are not integers, statuses outside :data:`STATUSES`, accuracies that are not numbers, lie
outside [0, 1] or look like percent ("divide by 100"), two arms with one name, fewer than
two classes or depths, an unknown test-set size, missing arms, unequal seeds, an incomplete
run, a non-finite accuracy of a run that did not diverge.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

from fathom.stats.quantities import fraction_problem
from fathom.stats.scaling_table import ArmRuns, DepthScalingTable

STATUSES = ("complete", "diverged", "failed", "running", "interrupted")


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


def bad_table(table: DepthScalingTable) -> str | None:
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
                if st not in STATUSES:
                    return (
                        f"depth {depth}, arm {arm!r}, seed {s}: unknown status {st!r} "
                        f"(one of {list(STATUSES)})"
                    )
                if st in ("failed", "running", "interrupted"):
                    return f"missing seed: depth {depth}, arm {arm!r}, seed {s} is {st}"
                finite = acc is not None and math.isfinite(float(acc))
                if st != "diverged" and not finite:
                    return f"depth {depth}, arm {arm!r}, seed {s}: accuracy {acc!r} is not finite"
    return _units(table)
