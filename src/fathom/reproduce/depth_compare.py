"""Seed 000's depth-scaling table beside Fathom's, and the two verdicts beside each other.

Fathom's side is the depth-scaling results table of the benchmark's run directories
(:func:`fathom.depthscale.table.build_table`: per run its ``test_acc`` at the
validation-selected epoch, ``lyapunov`` λ̂ at the last health check, ``grad_norm``, ``kappa``);
nothing here trains or recomputes a quantity. Per seed value (``seeds.toml``, table
``depth_scaling``) the extractors give Fathom's per-seed values:

* ``depth_arm``: ``x_s = metric(run at depth d, arm a, seed s)``;
* ``depth_delta``: ``x_s = acc(d, Lyapunov, s) - acc(d, vanilla, s)`` over seeds in both arms
  (the log's ``Δ Acc = Lyapunov Acc - Vanilla Acc``);
* ``depth_change``: ``x_s = acc(to, a, s) - acc(from, a, s)`` (the log's "4→20 accuracy change").

Difference, spread and within-spread flag are :func:`fathom.reproduce.compare.compare_row`'s.
The verdicts: the seed log's own sentence (``conclusion``, verbatim), Fathom's rule
(:func:`fathom.stats.depth_scaling_verdict`) applied to the seed log's own accuracies, and
Fathom's verdict on Fathom's runs, each with both of Fathom's answers (the level across
depths and the scaling with depth) and whether it reaches the log's conclusion: the log's
"enables better depth scaling" is a claim about the change with depth, so it is reached only
by the scaling answer ``"scales better"`` of the Lyapunov arm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fathom.depthscale.table import BASELINE, CANDIDATE, ResultsTable, RunRecord
from fathom.reproduce.compare import compare_row
from fathom.reproduce.extract import Measured, none
from fathom.reproduce.seeds import SeedData
from fathom.stats.scaling import depth_scaling_verdict
from fathom.stats.scaling_answers import SCALES_BETTER
from fathom.stats.scaling_table import ArmRuns, DepthScalingTable, DepthScalingVerdict

_FORMAT = 1
_KIND = "fathom.reproduce.depth_comparison"
SEED_CLAIM = SCALES_BETTER
"""The scaling answer the seed log's conclusion amounts to: the Lyapunov arm scales better."""


@dataclass(frozen=True)
class DepthSources:
    """Fathom's benchmark: its results table (runs with their flags)."""

    table: ResultsTable

    def runs(self, depth: int, arm: str) -> dict[int, RunRecord]:
        return {r.seed: r for r in self.table.records if r.depth == depth and r.arm == arm}


def _acc(src: DepthSources, depth: int, arm: str) -> dict[int, float]:
    return {s: r.test_acc for s, r in src.runs(depth, arm).items() if r.test_acc is not None}


def depth_arm(src: DepthSources, ex: Mapping[str, Any]) -> Measured:
    runs = src.runs(int(ex["depth"]), ex["arm"])
    if not runs:
        return Measured(missing=f"no {ex['arm']} run at depth {ex['depth']} in this benchmark")
    values = {s: getattr(r, ex["metric"]) for s, r in runs.items()}
    values = {s: float(v) for s, v in values.items() if v is not None}
    if not values:
        return Measured(missing=f"no run records {ex['metric']} at depth {ex['depth']}")
    return Measured(values)


def _paired(a: dict[int, float], b: dict[int, float], what: str) -> Measured:
    common = sorted(set(a) & set(b))
    if not common:
        return Measured(missing=f"no seed with {what}")
    return Measured({s: a[s] - b[s] for s in common}, note="paired by seed")


def depth_delta(src: DepthSources, ex: Mapping[str, Any]) -> Measured:
    d = int(ex["depth"])
    return _paired(
        _acc(src, d, CANDIDATE), _acc(src, d, BASELINE), f"both arms' accuracy at depth {d}"
    )


def depth_change(src: DepthSources, ex: Mapping[str, Any]) -> Measured:
    lo, hi, arm = int(ex["from"]), int(ex["to"]), ex["arm"]
    return _paired(_acc(src, hi, arm), _acc(src, lo, arm), f"{arm} accuracy at depths {lo}, {hi}")


_DEPTH_EXTRACTORS: dict[str, Callable[[Any, Mapping[str, Any]], Measured]] = {
    "depth_arm": depth_arm,
    "depth_delta": depth_delta,
    "depth_change": depth_change,
    "none": none,
}


_CIFAR100_TEST_EXAMPLES = 10_000
"""The size of the CIFAR-100 test set the seed log's accuracies are measured on."""


def seed_log_table(data: SeedData, table: str = "depth_scaling") -> DepthScalingTable:
    """The seed log's accuracies as Fathom's verdict input: one run per depth and arm
    (seed 0), status complete, fitting CE not recorded, chance from the log's 100 classes,
    accuracies on the CIFAR-100 test set (10,000 examples)."""
    acc = {
        (int(v.extract["depth"]), v.extract["arm"]): v.number
        for v in data.values_of(table)
        if v.kind == "depth_arm" and v.extract["metric"] == "test_acc"
    }
    rows = {
        d: {
            arm: ArmRuns(test_acc=[acc[(d, arm)]], status=["complete"], seeds=[0])
            for arm in (BASELINE, CANDIDATE)
        }
        for d in sorted({d for d, _ in acc})
    }
    return DepthScalingTable(
        classes=100,
        baseline=BASELINE,
        candidate=CANDIDATE,
        rows=rows,
        dataset="cifar100",
        n_eval=_CIFAR100_TEST_EXAMPLES,
    )


def answers(v: DepthScalingVerdict) -> dict[str, Any]:
    """Both of Fathom's answers of one verdict, and whether the scaling one is the log's."""
    return {
        "verdict": v.verdict,
        "level": v.level,
        "trend": v.trend,
        "headline": v.headline,
        "sentence": v.sentence,
        "reaches_seed_claim": v.trend == SEED_CLAIM,
    }


def verdicts(data: SeedData, table: ResultsTable, table_id: str) -> dict[str, Any]:
    """The log's conclusion, Fathom's rule on the log's numbers, Fathom's on its runs."""
    seed_table = next(t for t in data.table if t.id == table_id)
    on_log = depth_scaling_verdict(seed_log_table(data, table_id))
    mine = table.verdict
    return {
        "seed_conclusion": seed_table.conclusion,
        "seed_claim": SEED_CLAIM,
        "rule_on_seed_log": answers(on_log),
        "fathom": {**answers(mine), "observations": list(mine.observations)},
    }


def depth_comparison(
    data: SeedData,
    table: ResultsTable,
    *,
    pipeline: str,
    reductions: list[str],
    counterpart: str,
    devices: list[str],
    fit_sizes: list[int] | None = None,
) -> dict[str, Any]:
    """Every depth-scaling seed value beside Fathom's, the per-depth cells and the verdicts
    (``reproduction.json``'s contents for a depth-scaling pipeline)."""
    comparable = "scaled-down run (see scale_down)" if reductions else None
    src = DepthSources(table)
    tables = data.tables_of("depth_scaling")
    ids = {t.id for t in tables}
    rows = [
        {**compare_row(v, data, src, comparable, _DEPTH_EXTRACTORS), "extract": dict(v.extract)}
        for v in data.value
        if v.table in ids
    ]
    return {
        "format": _FORMAT,
        "kind": _KIND,
        "pipeline": pipeline,
        "dataset": table.dataset,
        "devices": devices,
        "fit_sizes": sorted(set(fit_sizes or [])),
        "scale_down": reductions,
        "comparable_in_magnitude": comparable is None,
        "caveat": (
            "Fathom's runs draw other initial parameters, batches and a held-out validation "
            "split the log did not have: numbers are compared with Fathom's seed-to-seed "
            "spread, never digit for digit."
        ),
        "tables": [
            {"id": t.id, "title": t.title, "source": data.source(t), "counterpart": counterpart}
            for t in tables
        ],
        "cells": {str(r["depth"]): r["cells"] for r in table.rows},
        "per_depth": table.verdict.to_dict()["per_depth"],
        "failures": {str(r["depth"]): r["failures"] for r in table.rows if r["failures"]},
        "verdicts": {t.id: verdicts(data, table, t.id) for t in tables},
        "rows": rows,
    }
