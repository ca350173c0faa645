"""Inputs and outputs of the depth-scaling verdict (the rule: :mod:`fathom.stats.scaling`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from fathom.stats.results import Comparison, Results


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
    ``"Lyapunov"``); ``classes`` is the number of classes (chance is ``1 / classes``);
    ``n_eval`` the number of test examples every accuracy is measured on.
    """

    classes: int
    baseline: str
    candidate: str
    rows: dict[int, dict[str, ArmRuns]]
    dataset: str = ""
    n_eval: int | None = None


@dataclass(frozen=True)
class FailedRun:
    """A run that failed or is undetermined against chance, with its flags."""

    depth: int
    arm: str
    seed: int
    flags: list[str]


@dataclass(frozen=True)
class FailureEvidence:
    """A depth where the arms' failure counts differ: ``against`` the candidate or ``for`` it.

    ``failed``/``other`` are ``(failed seeds, seeds)`` of the arm failing more and of the
    other; ``p_value`` is the two-sided Fisher exact test on those counts; ``decisive``:
    rejected by Holm over the evidence depths at the nominal level.
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

    ``verdict``: ``"better scaling"`` / ``"worse scaling"`` / ``"equivalent scaling"``
    (candidate against baseline, with ``fragile`` when leaving a seed out reverses it),
    ``"not established"``, ``"inconclusive"`` (an established profile contradicted by an
    established per-depth interval or decisive failure evidence), ``"no conclusion"`` (an
    arm trained nowhere) or ``"no comparison"`` (bad input, ``sentence`` names the reason).
    ``cells[depth][arm]``: ``trained`` / ``failed`` / ``partial`` / ``undetermined``.
    ``profile`` is the paired contrast over ``determined`` depths; ``per_depth`` the
    Holm-corrected per-depth comparisons (same family); ``results`` the typed model.
    """

    verdict: str
    sentence: str
    cells: dict[int, dict[str, str]] = field(default_factory=dict)
    excluded: list[FailedRun] = field(default_factory=list)
    per_depth: dict[int, Comparison] = field(default_factory=dict)
    profile: Comparison | None = None
    determined: list[int] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    excluded_depths: dict[int, str] = field(default_factory=dict)
    evidence: list[FailureEvidence] = field(default_factory=list)
    fragile: bool = False
    results: Results = field(default_factory=Results)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (depth keys become strings)."""
        return {
            "verdict": self.verdict,
            "sentence": self.sentence,
            "fragile": self.fragile,
            "cells": {str(d): dict(c) for d, c in self.cells.items()},
            "excluded": [asdict(f) for f in self.excluded],
            "per_depth": {str(d): v.to_dict() for d, v in self.per_depth.items()},
            "profile": None if self.profile is None else self.profile.to_dict(),
            "determined": list(self.determined),
            "observations": list(self.observations),
            "excluded_depths": {str(d): why for d, why in self.excluded_depths.items()},
            "evidence": [asdict(e) for e in self.evidence],
        }


def bad_table(table: DepthScalingTable) -> str | None:
    """Why ``table`` allows no comparison (bad input, named), or None."""
    arms = (table.baseline, table.candidate)
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
                if st not in ("complete", "diverged", "failed", "running", "interrupted"):
                    return f"depth {depth}, arm {arm!r}, seed {s}: unknown status {st!r}"
                if st in ("failed", "running", "interrupted"):
                    return f"missing seed: depth {depth}, arm {arm!r}, seed {s} is {st}"
                finite = acc is not None and math.isfinite(float(acc))
                if st != "diverged" and not finite:
                    return f"depth {depth}, arm {arm!r}, seed {s}: accuracy {acc!r} is not finite"
    return None
