"""Fathom's counterpart of each seed value, read from a pipeline's outputs on disk.

Every extractor returns a :class:`Measured`: the per-seed values behind Fathom's number
(one entry for a single run) in the seed value's units (``scale`` converts fractions to
percent), or the reason it could not be computed. Nothing here trains or recomputes: the
study's run directories, ``audit/audit.json``, each run's ``curvature/summary.json`` and the
head diagnostic's ``head.json`` are the inputs (:class:`Sources`).

Seed 002's telemetry tables are read through the cross-run table code: the study's runs are
read once by :func:`fathom.report.runs.load_runs`; only main-phase runs count
(:func:`fathom.report.crosstable.by_recipe`), and layers are matched across recipes by the
report's alignment (:func:`fathom.report.crossrun.study_alignment`,
:func:`fathom.report.telemetry_tables.aligned_fields`). Every quantity is a field the telemetry
recorded (its one definition is in :mod:`fathom.telemetry.moments` and the registry); the
extractor only selects cells (:func:`telemetry_layers`), and :func:`fathom_tables` gives the
cross-run tables themselves (for a seed table whose numbers the seed's text does not give:
Fathom's side is printed whole).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fathom.base.units import percent
from fathom.report.crossrun import crossrun_tables, default_reference, study_alignment
from fathom.report.crosstable import CrossTable, by_recipe, last_epoch, seed_values, spread
from fathom.report.layers import output_label
from fathom.report.telemetry_tables import aligned_fields
from fathom.rundir import RunDir
from fathom.rundir.reader import read_audit, read_curvature
from fathom.rundir.record import AuditedRun, AuditRecord
from fathom.study.records import checkpoint_scores


@dataclass(frozen=True)
class Measured:
    """Per-seed values (``{seed: value}``) of one quantity, or ``missing`` saying why not.

    ``epochs``: per seed, the epoch of Fathom's checkpoint or snapshot the value was read at
    (absent for a whole-run quantity such as a clock ratio); ``totals``: per seed, the
    denominator of a count (``correct`` of ``total`` test examples of one digit).
    """

    values: dict[int, float] = field(default_factory=dict)
    missing: str | None = None
    note: str | None = None
    epochs: dict[int, int] = field(default_factory=dict)
    totals: dict[int, int] = field(default_factory=dict)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


@dataclass
class Sources:
    """The outputs of one pipeline, loaded once (``None`` where a step has not run)."""

    root: Path
    summary: dict[str, Any]
    audit: AuditRecord | None
    curvature: dict[tuple[str, int], dict[int, dict[str, Any]]]
    head: dict[str, Any] | None
    epoch_map: dict[int, int]
    _runs: list[Any] | None = field(default=None, repr=False)

    def run_data(self) -> list[Any]:
        """Every run under the study root as reports read it (loaded once)."""
        from fathom.report.runs import load_runs

        if self._runs is None:
            self._runs = load_runs(self.root)
        return self._runs

    @classmethod
    def load(
        cls,
        root: Path,
        curvature_runs: Mapping[tuple[str, int], Path],
        head_dir: Path | None,
        epoch_map: Mapping[int, int],
    ) -> Sources:
        curv: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
        for key, run_dir in curvature_runs.items():
            record = read_curvature(run_dir)
            if record is not None and record.summary is not None:
                curv[key] = record.summary.by_epoch()
        return cls(
            root=root,
            summary=json.loads((root / "summary.json").read_text()),
            audit=read_audit(root),
            curvature=curv,
            head=None if head_dir is None else _read_json(head_dir / "head.json"),
            epoch_map={int(k): int(v) for k, v in epoch_map.items()},
        )

    def main_runs(self, recipe: str) -> dict[int, RunDir]:
        """``{seed: RunDir}`` of the study's main runs of ``recipe``."""
        return {
            int(r["seed"]): RunDir(self.root / run_id)
            for run_id, r in self.summary["runs"].items()
            if r["recipe"] == recipe
        }


def _scaled(values: Mapping[int, float | None], scale: float) -> dict[int, float]:
    return {s: scale * float(v) for s, v in values.items() if v is not None}


def _study_values(
    src: Sources, ex: Mapping[str, Any], recipe: str
) -> tuple[dict[int, float], dict[int, int]]:
    """``({seed: metric}, {seed: epoch})`` at the checkpoint ``ex["checkpoint"]``."""
    out, epochs = {}, {}
    for seed, rd in src.main_runs(recipe).items():
        scores = checkpoint_scores(rd)[ex["checkpoint"]]
        out[seed] = scores.get(ex["metric"])
        if scores.get("epoch") is not None and out[seed] is not None:
            epochs[seed] = int(scores["epoch"])
    return _scaled(out, float(ex.get("scale", 1))), epochs


def study(src: Sources, ex: Mapping[str, Any]) -> Measured:
    values, epochs = _study_values(src, ex, ex["recipe"])
    if not values:
        return Measured(missing=f"no complete {ex['recipe']} run")
    return Measured(values, epochs=epochs)


def study_diff(src: Sources, ex: Mapping[str, Any]) -> Measured:
    a, epochs = _study_values(src, ex, ex["recipe"])
    b, _ = _study_values(src, ex, ex["reference"])
    common = sorted(set(a) & set(b))
    if not common:
        return Measured(missing=f"no seed with both {ex['recipe']} and {ex['reference']}")
    diffs = {s: a[s] - b[s] for s in common}
    return Measured(diffs, note="paired by seed", epochs={s: epochs[s] for s in common})


def study_clock(src: Sources, ex: Mapping[str, Any]) -> Measured:
    """The training clock of each complete run, over the epochs it completed."""
    runs = {s: rd for s, rd in src.main_runs(ex["recipe"]).items() if rd.status == "complete"}
    values = {s: rd.record.clocks.training_s for s, rd in runs.items()}
    epochs = {s: rd.record.epochs_completed for s, rd in runs.items()}
    return Measured(_scaled(values, 1.0), epochs=epochs)


def manifest_stat(src: Sources, ex: Mapping[str, Any]) -> Measured:
    """The ``stat`` (``min`` or ``max``) of a dotted manifest field over every main run, or
    those of ``recipes`` / ``seed`` when given (one number): e.g. the range of the telemetry
    overhead over the study's runs. ``epochs``: the epochs those runs completed."""
    found, lengths = [], []
    for run_id, r in src.summary["runs"].items():
        if ("recipes" in ex and r["recipe"] not in ex["recipes"]) or (
            "seed" in ex and int(r["seed"]) != int(ex["seed"])
        ):
            continue
        rd = RunDir(src.root / run_id)
        node: Any = rd.manifest  # a dotted path into the manifest as written
        for part in ex["path"].split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, (int, float)):
            found.append(float(node) * float(ex.get("scale", 1)))
            if rd.header.epochs_completed is not None:
                lengths.append(rd.header.epochs_completed)
    if not found:
        return Measured(missing=f"no (selected) main run records {ex['path']}")
    pick = {"min": min, "max": max}[ex["stat"]]
    note = f"{ex['stat']} over {len(found)} main runs"
    return Measured({0: pick(found)}, note=note, epochs=dict(enumerate(lengths)))


def _audit_values(
    src: Sources, ex: Mapping[str, Any], recipe: str, get: Callable[[dict[str, Any]], Any]
) -> dict[int, float]:
    out: dict[int, float | None] = {}
    for run, rec in _audited(src, ex, recipe):
        try:
            out[run.seed] = get(rec)
        except (KeyError, TypeError, IndexError):
            out[run.seed] = None
    return _scaled(out, float(ex.get("scale", 1)))


def _audited(
    src: Sources, ex: Mapping[str, Any], recipe: str
) -> list[tuple[AuditedRun, dict[str, Any]]]:
    """``[(run, checkpoint record)]`` of ``recipe``'s audited runs at ``ex["checkpoint"]``."""
    found = []
    for run in [] if src.audit is None else src.audit.runs:
        rec = run.audited(ex["checkpoint"])
        if run.recipe == recipe and rec is not None:
            found.append((run, rec))
    return found


def _audit_measured(src: Sources, ex: Mapping[str, Any], values: dict[int, float]) -> Measured:
    """``values`` with the epoch of each seed's audited checkpoint."""
    epochs = {
        run.seed: int(rec["epoch"])
        for run, rec in _audited(src, ex, ex["recipe"])
        if rec.get("epoch") is not None and run.seed in values
    }
    return Measured(values, epochs=epochs)


def _size_getter(ex: Mapping[str, Any]) -> Callable[[dict[str, Any]], Any]:
    return lambda rec: rec["by_size"][str(ex["kept"])]["test"][ex["metric"]]


def _needs_audit(src: Sources) -> str | None:
    return None if src.audit is not None else "the audit step has not run (no audit/audit.json)"


def audit_size(src: Sources, ex: Mapping[str, Any]) -> Measured:
    if (why := _needs_audit(src)) is not None:
        return Measured(missing=why)
    values = _audit_values(src, ex, ex["recipe"], _size_getter(ex))
    if not values:
        return Measured(missing=f"{ex['recipe']} was not audited")
    return _audit_measured(src, ex, values)


def audit_size_diff(src: Sources, ex: Mapping[str, Any]) -> Measured:
    if (why := _needs_audit(src)) is not None:
        return Measured(missing=why)
    a = _audit_values(src, ex, ex["recipe"], _size_getter(ex))
    b = _audit_values(src, ex, ex["reference"], _size_getter(ex))
    common = sorted(set(a) & set(b))
    if not common:
        return Measured(missing=f"no seed audited for both {ex['recipe']} and {ex['reference']}")
    m = _audit_measured(src, ex, {s: a[s] - b[s] for s in common})
    return Measured(m.values, note="paired by seed", epochs=m.epochs)


def audit_branch(src: Sources, ex: Mapping[str, Any]) -> Measured:
    if (why := _needs_audit(src)) is not None:
        return Measured(missing=why)
    values = _audit_values(
        src, ex, ex["recipe"], lambda rec: rec["branches"][ex["branch"]]["test"][ex["metric"]]
    )
    if not values:
        return Measured(missing=f"{ex['recipe']} was not audited")
    return _audit_measured(src, ex, values)


def audit_interactions(src: Sources, ex: Mapping[str, Any]) -> Measured:
    if (why := _needs_audit(src)) is not None:
        return Measured(missing=why)
    values = _audit_values(
        src, ex, ex["recipe"], lambda rec: rec["interactions"]["test"]["mean_fraction"]
    )
    if not values:
        return Measured(missing="interactions not defined")
    return _audit_measured(src, ex, values)


def _curvature_value(src: Sources, recipe: str, epoch: int, name: str) -> tuple[float | None, str]:
    """One field of the snapshot standing in for seed epoch ``epoch`` (``epoch_map``) of the
    curvature run of ``recipe``; ``(None, why)`` when absent."""
    runs = [k for k in src.curvature if k[0] == recipe]
    if not runs:
        return None, f"no curvature of a {recipe} run (the curvature step has not run for it)"
    if epoch not in src.epoch_map:
        return None, f"seed epoch {epoch} has no counterpart snapshot in this pipeline"
    mapped = src.epoch_map[epoch]
    row = src.curvature[runs[0]].get(mapped)
    if row is None or row.get(name) is None:
        return None, f"no {name} at epoch {mapped} for {recipe}"
    return float(row[name]), f"seed {runs[0][1]}, snapshot epoch {mapped}"


def _curvature_seed(src: Sources, recipe: str) -> int:
    return next(seed for r, seed in src.curvature if r == recipe)


def curvature(src: Sources, ex: Mapping[str, Any]) -> Measured:
    v, why = _curvature_value(src, ex["recipe"], int(ex["epoch"]), ex["field"])
    if v is None:
        return Measured(missing=why)
    seed = _curvature_seed(src, ex["recipe"])
    mapped = src.epoch_map[int(ex["epoch"])]
    return Measured({seed: v * float(ex.get("scale", 1))}, note=why, epochs={seed: mapped})


def _curvature_quotient(
    src: Sources, ex: Mapping[str, Any], num: tuple[str, str], den: tuple[str, str]
) -> Measured:
    """``value(num) / value(den)`` at ``ex["epoch"]``, each a ``(recipe, field)`` pair."""
    epoch = int(ex["epoch"])
    a, why_a = _curvature_value(src, num[0], epoch, num[1])
    b, why_b = _curvature_value(src, den[0], epoch, den[1])
    if a is None or b is None or b == 0:
        return Measured(missing=why_a if a is None else (why_b if b is None else "zero divisor"))
    seed = _curvature_seed(src, ex["recipe"])
    return Measured({seed: a / b}, note=why_a, epochs={seed: src.epoch_map[epoch]})


def curvature_ratio(src: Sources, ex: Mapping[str, Any]) -> Measured:
    """One field of ``recipe`` over the same field of ``reference``."""
    return _curvature_quotient(src, ex, (ex["recipe"], ex["field"]), (ex["reference"], ex["field"]))


def curvature_field_ratio(src: Sources, ex: Mapping[str, Any]) -> Measured:
    """Field ``field`` over field ``over`` of one recipe."""
    return _curvature_quotient(src, ex, (ex["recipe"], ex["field"]), (ex["recipe"], ex["over"]))


def curvature_max(src: Sources, ex: Mapping[str, Any]) -> Measured:
    found = []
    for recipe in ex["recipes"]:
        v, why = _curvature_value(src, recipe, int(ex["epoch"]), ex["field"])
        if v is None:
            return Measured(missing=why)
        found.append(v * float(ex.get("scale", 1)))
    return Measured(
        {0: max(found)},
        note=f"maximum over {', '.join(ex['recipes'])}",
        epochs={0: src.epoch_map[int(ex["epoch"])]},
    )


def head(src: Sources, ex: Mapping[str, Any]) -> Measured:
    if src.head is None:
        return Measured(missing="the head diagnostic has not run (no head.json)")
    arm = src.head["heads"][ex["head"]]
    seed = int(src.head["seed"])
    epochs = {seed: int(arm.get("epoch", src.head["epochs"]))}
    note = f"seed {seed}"
    if ex["metric"] == "accuracy":
        return Measured(
            {seed: arm["accuracy"] * float(ex.get("scale", 1))}, note=note, epochs=epochs
        )
    cell = next(c for c in arm["per_class"] if c["digit"] == ex["digit"])
    totals = {seed: int(cell["total"])} if ex["metric"] == "correct" else {}
    return Measured({seed: float(cell[ex["metric"]])}, note=note, epochs=epochs, totals=totals)


def _reference(src: Sources) -> str | None:
    return default_reference(src.run_data(), src.summary)


def _layer_cells(
    src: Sources, base: str, recipe: str, as_percent: bool
) -> tuple[int | None, list[tuple[str, dict[int, float], dict[str, Any] | None]]]:
    """``(epoch, [(layer, {seed: v_s(L)}, spread)])`` of ``recipe`` at its last epoch, the
    layers aligned across recipes as the report aligns them."""
    runs, ref = src.run_data(), _reference(src)
    groups = by_recipe(runs, ref)
    rs = groups.get(recipe, [])
    main = [r for g in groups.values() for r in g]
    fields = aligned_fields(main, base, study_alignment(runs, ref))
    ends = [last_epoch(r, f) for lab in fields for r in rs if (f := fields[lab].get(r.run_id))]
    ends = [e for e in ends if e is not None]
    if not ends:
        return None, []
    e = min(ends)
    convert = percent if as_percent else float
    cells = []
    for lab, per_run in fields.items():
        raw = seed_values(rs, per_run, e)
        values = {s: float(convert(v)) for s, v in raw.items()}
        cells.append((lab, values, spread(list(raw.values()), convert)))
    return e, cells


def telemetry_layers(src: Sources, ex: Mapping[str, Any]) -> Measured:
    """The chosen layer's per-seed values (``ex``: ``base``, ``recipe``, ``over``, optional
    ``percent``).

    The layers L are the aligned ``<base>/<L>`` fields. At the recipe's last recorded epoch
    ``e`` (the earliest last epoch over its runs and layers, as
    :func:`~fathom.report.telemetry_tables.activation_table` takes it), each layer's cell is the
    spread over seeds of ``v_s(L) = value_at(run_s, <base>/<L>, e)``
    (:func:`~fathom.report.crosstable.spread`; fractions to percent by
    :func:`fathom.base.units.percent`). ``over = "min"`` / ``"max"`` picks the layer whose seed
    mean is smallest / largest -- the seed's "69–74% across its hidden layers" is the range of
    its per-layer seed means -- and ``"head"`` the head layer (as the report's gradient table
    picks it). Fathom's per-seed values are the chosen layer's ``v_s(L)``, so the comparison's
    mean, range and interval are that cell's.
    """
    epoch, cells = _layer_cells(src, ex["base"], ex["recipe"], bool(ex.get("percent", False)))
    cells = [c for c in cells if c[2] is not None]
    if not cells:
        return Measured(missing=f"no {ex['base']}/<layer> field in the {ex['recipe']} runs")
    over = ex["over"]
    if over == "head":
        head = output_label([layer for layer, _, _ in cells])
        layer, values, _ = next(c for c in cells if c[0] == head)
        note = f"head layer {layer}, epoch {epoch}"
    else:
        pick = {"min": min, "max": max}[over]
        layer, values, _ = pick(cells, key=lambda c: c[2]["mean"])  # type: ignore[index]
        note = f"{over} over {len(cells)} layers of the seed mean: {layer}, epoch {epoch}"
    epochs = {} if epoch is None else {seed: epoch for seed in values}
    return Measured(values, note=note, epochs=epochs)


def fathom_tables(src: Sources) -> dict[str, CrossTable]:
    """Every cross-run table the study's runs support, by name (curvature tables left out)."""
    return {t.name: t for t in crossrun_tables(src.run_data(), _reference(src))}


def none(src: Sources, ex: Mapping[str, Any]) -> Measured:
    return Measured(missing="not recomputed by this pipeline")


EXTRACTORS: dict[str, Callable[[Sources, Mapping[str, Any]], Measured]] = {
    f.__name__: f
    for f in (
        study,
        study_diff,
        study_clock,
        manifest_stat,
        audit_size,
        audit_size_diff,
        audit_branch,
        audit_interactions,
        curvature,
        curvature_ratio,
        curvature_field_ratio,
        curvature_max,
        head,
        telemetry_layers,
        none,
    )
}
