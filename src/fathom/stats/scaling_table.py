"""Inputs and outputs of the depth-scaling verdict (the rule: :mod:`fathom.stats.scaling`;
its input checks with it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from fathom.stats.results import Comparison, Results
from fathom.stats.verdicts import LevelVerdict, TrendVerdict

_Outcome = Literal["judged", "no comparison", "no conclusion"]
"""Whether the table was judged at all (both answers given) or why not."""


@dataclass(frozen=True)
class ArmRuns:
    """One arm at one depth: per-seed test accuracy (a fraction in [0, 1]), training CE and
    run status.

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
    ``n_eval`` the number of test examples every accuracy is measured on. Depths are
    integers (numbers of layers or blocks): the slope is taken over their values.
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
class Scenario:
    """Both answers for one reading of the undetermined runs (``reading``: ``""`` when no run
    is undetermined, else ``"at chance"`` or ``"at their values"``).

    ``depths``: the depths judged (both arms failed on every seed at none of them);
    ``level_contrast`` the paired mean over ``depths`` of candidate − baseline (pp);
    ``change`` the paired change of that difference from the shallowest to the deepest of
    ``depths`` (pp); ``slope`` its least-squares slope over depth (pp per layer);
    ``per_depth`` the paired comparison at each of ``depths``: one Holm family.
    ``reason``: why nothing was judged (fewer than two depths), else ``""``.
    """

    reading: str
    family: str
    depths: list[int]
    level: LevelVerdict
    trend: TrendVerdict
    level_contrast: Comparison | None = None
    change: Comparison | None = None
    slope: Comparison | None = None
    per_depth: dict[int, Comparison] = field(default_factory=dict)
    evidence: list[FailureEvidence] = field(default_factory=list)
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (depth keys become strings)."""
        comp = {k: getattr(self, k) for k in ("level_contrast", "change", "slope")}
        return {
            "reading": self.reading,
            "family": self.family,
            "depths": list(self.depths),
            "level": self.level,
            "trend": self.trend,
            **{k: None if c is None else c.to_dict() for k, c in comp.items()},
            "per_depth": {str(d): c.to_dict() for d, c in self.per_depth.items()},
            "evidence": [asdict(e) for e in self.evidence],
            "reason": self.reason,
        }


@dataclass(frozen=True)
class DepthScalingVerdict:
    """The computed depth-scaling conclusion: two answers, given apart.

    ``level``: is the candidate better across the depths (the paired mean over depths);
    ``trend``: does its advantage change with depth (the paired change from the shallowest
    to the deepest judged depth and the least-squares slope over depth). Only ``trend``
    says "scales better/worse". ``verdict`` is ``"judged"``, ``"no comparison"`` (bad
    input; ``sentence`` names the reason) or ``"no conclusion"`` (an arm trained nowhere).
    ``cells[depth][arm]``: ``trained`` / ``failed`` / ``partial`` / ``undetermined``.
    ``scenarios``: one reading of the table, or two when a run is undetermined (at chance,
    at its value): an answer stands only where both readings agree. ``both_failed``: the
    depths where every run of both arms failed, named and judged in no family.
    ``lines``: the sentences ``sentence`` joins (headline, level and scaling per reading,
    notes), for renderers that list them.
    """

    verdict: _Outcome
    sentence: str
    level: LevelVerdict = "no comparison"
    trend: TrendVerdict = "no comparison"
    headline: str = ""
    lines: list[str] = field(default_factory=list)
    cells: dict[int, dict[str, str]] = field(default_factory=dict)
    excluded: list[FailedRun] = field(default_factory=list)
    scenarios: list[Scenario] = field(default_factory=list)
    both_failed: list[int] = field(default_factory=list)
    undetermined: list[FailedRun] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    level_fragile: bool = False
    trend_fragile: bool = False
    results: Results = field(default_factory=Results)

    @property
    def per_depth(self) -> dict[int, Comparison]:
        """The per-depth comparisons of the first reading (empty when not judged)."""
        return self.scenarios[0].per_depth if self.scenarios else {}

    @property
    def level_contrast(self) -> Comparison | None:
        """The level contrast of the first reading."""
        return self.scenarios[0].level_contrast if self.scenarios else None

    @property
    def change(self) -> Comparison | None:
        """The change contrast (shallowest to deepest) of the first reading."""
        return self.scenarios[0].change if self.scenarios else None

    @property
    def slope(self) -> Comparison | None:
        """The slope contrast (pp per layer) of the first reading."""
        return self.scenarios[0].slope if self.scenarios else None

    def answer_lines(self, candidate: str, baseline: str) -> list[str]:
        """``Level (…): better across depths, fragile`` and ``Scaling (…): …``: the two
        answers, each named with its question (what every renderer prints first)."""
        fragile = {True: ", fragile", False: ""}
        return [
            f"Level ({candidate} against {baseline} across the depths): "
            f"{self.level}{fragile[self.level_fragile]}",
            "Scaling (how their difference changes with depth): "
            f"{self.trend}{fragile[self.trend_fragile]}",
        ]

    def _per_depth_dict(self) -> dict[str, dict[str, Any]]:
        """Every depth's comparison of the first reading; a depth without one names why."""
        why = self.sentence if self.verdict != "judged" else "both arms failed on every seed"
        return {
            str(d): self.per_depth[d].to_dict()
            if d in self.per_depth
            else {"verdict": "no comparison", "reason": why}
            for d in self.cells
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (depth keys become strings)."""
        return {
            "verdict": self.verdict,
            "level": self.level,
            "trend": self.trend,
            "headline": self.headline,
            "sentence": self.sentence,
            "lines": list(self.lines),
            "level_fragile": self.level_fragile,
            "trend_fragile": self.trend_fragile,
            "cells": {str(d): dict(c) for d, c in self.cells.items()},
            "excluded": [asdict(f) for f in self.excluded],
            "undetermined": [asdict(f) for f in self.undetermined],
            "both_failed": list(self.both_failed),
            "per_depth": self._per_depth_dict(),
            "scenarios": [s.to_dict() for s in self.scenarios],
            "observations": list(self.observations),
        }
