"""TensorBoard export: one event-file directory per run, ``<out>/<run_id>/`` (``tensorboard --logdir <out>``).

Each history row becomes one event with ``step = epoch`` holding every scalar of the
row (:func:`fathom.export.common.flatten_row`) as a float32 ``simple_value`` (a boolean
as 1.0 / 0.0); a null
value is not written (TensorBoard draws the gap), NaN and infinities are written as
such. Accuracy is in percent under ``<name>_pct`` (:mod:`fathom.export.common`); the first
event of each accuracy tag carries its unit as the tag's metadata (display name
``"<tag> (%)"``, description naming the conversion). The event's ``wall_time`` is the row's ``clock/elapsed_s`` (the last known one when
the row lacks it, 0 before any): TensorBoard's "relative" axis then shows Fathom's
elapsed time, never the exporter's; ``clock/training_s`` is a scalar of its own.

Verification reloads every directory with TensorBoard's ``EventAccumulator`` with no
sampling (``size_guidance`` 0) and requires, for every tag, exactly the written steps
and values equal after rounding the source (converted to export units) to float32 (NaN
matching NaN), and each accuracy tag's unit description.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from fathom.errors import FathomError, install_hint
from fathom.export.common import VerifyReport, export_scalars, units_table
from fathom.report.runs import RunData


def _require() -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise FathomError(
            "the TensorBoard export needs the tensorboard package, which is not installed; install the "
            f"extra with `{install_hint('tensorboard')}`"
        ) from None


UNIT_DESCRIPTION = (
    "accuracy in percent: 100 x the fraction recorded in history.jsonl (fathom.stats.units.percent)"
)


def summary_for(values: dict[str, Any], undescribed: set[str]) -> Any:
    """One ``Summary`` of a row's non-null scalars; an accuracy tag's first value states its unit.

    ``undescribed``: the accuracy tags whose unit is still to be written (updated in place;
    start from :func:`fathom.export.common.units_table` of the run).
    """
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata

    out = []
    for k, v in values.items():
        if v is None:
            continue
        value = Summary.Value(tag=k, simple_value=float(v))
        if k in undescribed:
            value.metadata.CopyFrom(
                SummaryMetadata(
                    display_name=f"{k} (%)",
                    summary_description=UNIT_DESCRIPTION,
                    plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"),
                )
            )
            undescribed.discard(k)
        out.append(value)
    return Summary(value=out)


def expected_scalars(run: RunData) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(epoch, value)]`` for every non-null scalar, in epoch order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in run.rows:
        values, _ = export_scalars(row)
        for k, v in values.items():
            if v is not None:
                out.setdefault(k, []).append((int(row["epoch"]), float(v)))
    return out


def write(runs: list[RunData], out: Path) -> list[str]:
    _require()
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    for run in runs:
        writer = EventFileWriter(str(out / run.run_id))
        wall = 0.0
        undescribed = set(units_table([run]))
        try:
            for row in run.rows:
                elapsed = row.get("clock/elapsed_s")
                if isinstance(elapsed, int | float) and math.isfinite(elapsed):
                    wall = float(elapsed)
                summary = summary_for(export_scalars(row)[0], undescribed)
                writer.add_event(Event(wall_time=wall, step=int(row["epoch"]), summary=summary))
        finally:
            writer.close()
    return [r.run_id for r in runs]


def _same32(expected: float, got: float) -> bool:
    with np.errstate(over="ignore"):
        a, b = np.float32(expected), np.float32(got)
    return bool(np.isnan(a) and np.isnan(b)) or bool(a == b)


def verify(
    runs: list[RunData], out: Path, report: VerifyReport, *, events_dir: Path | None = None
) -> None:
    """Read ``out/<run_id>/`` back (``events_dir`` instead, for a single run's live log)."""
    _require()
    if events_dir is not None and len(runs) != 1:
        raise FathomError("events_dir names one run's event directory; pass exactly one run")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    report.notes.append(
        "TensorBoard stores float32: values compared after rounding the source to float32"
    )
    for run in runs:
        report.runs += 1
        report.rows += len(run.rows)
        path = events_dir if events_dir is not None else out / run.run_id
        if not path.is_dir():
            report.mismatch(f"run {run.run_id}: no event directory {path}")
            continue
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        tags = set(acc.Tags().get("scalars", []))
        expected: dict[str, Any] = expected_scalars(run)
        accuracy_tags = set(units_table([run]))
        if tags != set(expected):
            report.mismatch(f"run {run.run_id}: tags differ {sorted(tags ^ set(expected))[:5]}")
        for tag, points in expected.items():
            if tag not in tags:
                continue
            if tag in accuracy_tags and (
                acc.SummaryMetadata(tag).summary_description != UNIT_DESCRIPTION
            ):
                report.mismatch(f"run {run.run_id} {tag}: the unit (percent) is not stated")
            events = acc.Scalars(tag)
            report.steps += len(events)
            if [e.step for e in events] != [s for s, _ in points]:
                report.mismatch(
                    f"run {run.run_id} {tag}: steps {[e.step for e in events]} != {[s for s, _ in points]}"
                )
                continue
            for (step, v), e in zip(points, events):
                report.values += 1
                if not _same32(v, e.value):
                    report.mismatch(
                        f"run {run.run_id} {tag} step {step}: wrote {v!r}, read {e.value!r}"
                    )
