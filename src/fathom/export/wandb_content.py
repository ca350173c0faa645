"""What the W&B export writes for a run, shared by the writer (:mod:`fathom.export.wandb_export`)
and the reader (:mod:`fathom.export.wandb_verify`): the config, the summary, a row's scalars
and matrices, a matrix's table, the checkpoints logged as artifacts. The layout and its
reasons are in :mod:`fathom.export.wandb_export`'s docstring."""

from __future__ import annotations

import re
from typing import Any

from fathom.base.io import json_safe, sha256_file
from fathom.errors import FathomError, install_hint
from fathom.export.analyses import run_analyses
from fathom.export.common import flatten_row, in_export_units, is_matrix, units_table
from fathom.export.describe import as_trained
from fathom.report.runs import RunData
from fathom.rundir.record import RecordedRun

TABLE_SUFFIX = "_table"
CHART = "wandb/confusion_matrix/v1"
_MATRIX_COLUMNS: dict[str, tuple[str, str, str]] = {
    "confusion": ("Actual", "Predicted", "nPredictions"),
}
"""A matrix field's last name segment -> its table's columns (row index, column index, value)."""
GENERIC_COLUMNS = ("row", "column", "value")
_RESERVED = ("trained", "fathom")  # config keys the export adds beside the run's sections


def wandb_module():
    try:
        import wandb
    except ImportError:
        raise FathomError(
            "the W&B export needs the wandb package, which is not installed; install the extra with "
            f"`{install_hint('wandb')}`"
        ) from None
    return wandb


def wandb_id(run_id: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9_-]", "-", run_id)
    return clean[:64]


def run_config(run: RunData) -> dict[str, Any]:
    """The run's config sections at the top, ``trained`` and ``fathom`` beside them (the
    manifest's ``hashes``, ``data``, ``environment`` and ``clocks`` as written)."""
    m = run.recorded
    clash = sorted(set(run.config) & set(_RESERVED))
    if clash:
        raise FathomError(
            f"run {run.run_id!r}: config sections {clash} collide with the keys the W&B export "
            "adds; rename them"
        )
    return json_safe(
        {
            **dict(run.config),
            "trained": as_trained(run),
            "fathom": {
                "config_hash": m.config_hash,
                "source_hash": m.source_hash,
                **{s: _as_written(m, s) for s in ("hashes", "data", "environment")},
                "clocks": m.clocks,
                "export": run.metadata(),
                "units": units_table([run]),
            },
        }
    )


def _as_written(m: RecordedRun, section: str) -> dict[str, Any] | None:
    """``section`` of the manifest as written; ``None`` where it records none."""
    return getattr(m, section).as_json() if section in m.given() else None


def run_summary(run: RunData) -> dict[str, Any]:
    m = run.recorded
    out = {
        "fathom/status": m.status,
        "fathom/epochs_completed": m.epochs_completed,
        "fathom/selected_epoch": m.selected.epoch,
        "fathom/selected_val_ce": m.selected.val_ce,
    }
    out.update({f"fathom/clock/{k}": v for k, v in (m.clocks or {}).items()})
    return out


def row_values(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[list[Any]]]]:
    """``(scalars, matrices)`` of one row in export units: matrices whole, the rest flattened."""
    values = in_export_units(row)
    matrices = {k: v for k, v in values.items() if is_matrix(v)}
    scalars, _ = flatten_row({k: v for k, v in values.items() if k not in matrices})
    return scalars, matrices


def columns(name: str) -> tuple[str, str, str]:
    return _MATRIX_COLUMNS.get(name.rsplit("/", 1)[-1], GENERIC_COLUMNS)


def table_rows(matrix: list[list[Any]]) -> list[list[Any]]:
    """``[[i, j, m_ij], ...]`` in row-major order (``None`` kept: an undefined entry)."""
    return [[i, j, x] for i, r in enumerate(matrix) for j, x in enumerate(r)]


def analyses_by_epoch(run: RunData) -> tuple[dict[int, dict[str, float]], list[str]]:
    """The run's curvature and audit scalars (:mod:`fathom.export.analyses`) by epoch, to log
    with that epoch's row, and a note for each epoch that has no history row (not logged:
    W&B's steps are the history's epochs) or any source left out."""
    found = run_analyses(run)
    epochs = {int(r["epoch"]) for r in run.rows}
    by_epoch: dict[int, dict[str, float]] = {}
    for tag, points in found.points.items():
        for epoch, v in points:
            by_epoch.setdefault(epoch, {})[tag] = v
    notes = list(found.notes)
    for epoch in sorted(set(by_epoch) - epochs):
        notes.append(
            f"run {run.run_id}: analyses at epoch {epoch}, which has no history row, are not "
            "logged to W&B (its steps are the history's epochs)"
        )
        del by_epoch[epoch]
    return by_epoch, notes


def _checkpoint_aliases(run: RunData, epoch: int) -> list[str]:
    m = run.recorded
    aliases = [f"epoch-{epoch}"]
    aliases += [w for w, at in (("selected", m.selected), ("final", m.final)) if at.epoch == epoch]
    return aliases


def checked_checkpoints(run: RunData) -> list[dict[str, Any]]:
    """The manifest's checkpoints (epoch order), each file checked against its SHA-256."""
    out = []
    for key, entry in sorted(run.recorded.checkpoints.items(), key=lambda kv: int(kv[0])):
        path = run.path / entry.file
        if not path.is_file() or sha256_file(path) != entry.sha256:
            raise FathomError(
                f"run {run.run_id!r}: checkpoint {entry.file} is missing or differs from the "
                "SHA-256 its manifest records; export without --checkpoints, or train the run again"
            )
        out.append(
            {
                "epoch": int(key),
                "file": entry.file,
                "sha256": entry.sha256,
                "params_sha256": entry.params_sha256,
                "aliases": _checkpoint_aliases(run, int(key)),
            }
        )
    return out
