"""Inputs and outputs of the depth-scaling verdict (the rule: :mod:`fathom.stats.scaling`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fathom.errors import FathomError
from fathom.stats.intervals import Interval
from fathom.stats.verdicts import Verdict


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
    ``"Lyapunov"``); ``classes`` is the number of classes (chance is ``1 / classes``).
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
class FailureEvidence:
    """A depth where exactly one arm failed: ``against`` the candidate or ``for`` it.

    ``failed``/``trained`` are ``(failed seeds, seeds)`` of the failing and the other arm;
    ``p_value`` is the two-sided Fisher exact test on those counts.
    """

    depth: int
    direction: str
    failing_arm: str
    failed: tuple[int, int]
    other: tuple[int, int]
    p_value: float
    decisive: bool


@dataclass(frozen=True)
class DepthScalingVerdict:
    """The computed depth-scaling conclusion.

    ``verdict``: ``"better scaling"`` / ``"worse scaling"`` (candidate against baseline),
    ``"not established"``, ``"inconclusive"`` or ``"no conclusion"``. ``cells[depth][arm]``
    is ``"trained"``, ``"failed"`` or ``"partial"``. ``depth_range`` is the contiguous range
    ``R`` the interval covers; ``excluded_depths`` names every depth outside it and why;
    ``scaling`` is the paired interval of accuracy changes over ``R``.
    """

    verdict: str
    sentence: str
    cells: dict[int, dict[str, str]]
    excluded: list[FailedRun]
    per_depth: dict[int, Verdict]
    scaling: Interval | None
    depth_range: tuple[int, int] | None
    observations: list[str] = field(default_factory=list)
    excluded_depths: dict[int, str] = field(default_factory=dict)
    evidence: list[FailureEvidence] = field(default_factory=list)

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
            "excluded_depths": {str(d): why for d, why in self.excluded_depths.items()},
            "evidence": [asdict(e) for e in self.evidence],
        }


def validate_table(table: DepthScalingTable) -> None:
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
