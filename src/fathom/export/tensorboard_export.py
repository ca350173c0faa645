"""TensorBoard export: one event-file directory per run, ``<out>/<run_id>/`` (``tensorboard --logdir <out>``).

Each history row becomes one event with ``step = epoch`` holding every scalar of the
row (:func:`fathom.export.common.flatten_row`) as a float32 ``simple_value`` (a boolean
as 1.0 / 0.0); a null
value is not written (TensorBoard draws the gap), NaN and infinities are written as
such. Accuracy is in percent under ``<name>_pct`` (:mod:`fathom.export.common`); the first
event of each accuracy tag carries its unit as the tag's metadata (display name
``"<tag> (%)"``, description naming the conversion). The event's ``wall_time`` is the row's
own timestamp ``clock/unix_s`` (``clock/elapsed_s`` for a history older than that field, the
last known one when the row lacks both, 0 before any): TensorBoard's "wall" and "relative"
axes then show when the run trained, never when it was exported; ``clock/training_s`` is a
scalar of its own. The run's analyses (:mod:`fathom.export.analyses`: curvature summary and
audit, as ``curvature/...`` and ``audit/...`` scalars at step = epoch, each with its
definition) are written beside the history, with the wall time of their epoch's row.
The post-hoc export and the live sink (:class:`TensorBoardSink`) write the same events: one
history row as a ``Summary`` (accuracy's unit and every tag's registry description on its
first value), and the values a read-back expects from them.

Verification reloads every directory with TensorBoard's ``EventAccumulator`` with no
sampling (``size_guidance`` 0) and requires, for every tag, exactly the written steps
and values equal after rounding the source (converted to export units) to float32 (NaN
matching NaN), and each accuracy tag's unit description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fathom.errors import FathomError, install_hint
from fathom.export import common
from fathom.export import tensorboard_meta as meta
from fathom.export.analyses import run_analyses
from fathom.export.common import VerifyReport, flatten_row, in_export_units
from fathom.report.runs import RunData


def require() -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise FathomError(
            "the TensorBoard export needs the tensorboard package, which is not installed; install the "
            f"extra with `{install_hint('tensorboard')}`"
        ) from None


def _summary_for(values: dict[str, Any], described: set[str]) -> Any:
    """One ``Summary`` of a row's values (export units): scalars, and matrices as tensor + image.

    Every tag's first value carries its registry description (:mod:`.tensorboard_meta`);
    ``described``: the tags already described in this event directory (updated in place).
    """
    from tensorboard.compat.proto.summary_pb2 import Summary

    out = []
    for k, v in values.items():
        if common.is_matrix(v):
            out += meta.matrix_values(k, v, described)
            continue
        if v is None or not isinstance(v, int | float):
            continue
        value = Summary.Value(tag=k, simple_value=float(v))
        if k not in described:
            value.metadata.CopyFrom(meta.metadata(k, "scalars"))
            described.add(k)
        out.append(value)
    return Summary(value=out)


def _row_values(row: dict[str, Any]) -> dict[str, Any]:
    """A row in export units: matrices kept whole, every other field flattened to scalars."""
    values = in_export_units(row)
    values.pop(meta.WALL_FIELD, None)  # it is the event's wall time (float64), not a float32 scalar
    matrices = {k: v for k, v in values.items() if common.is_matrix(v)}
    scalars, _ = flatten_row({k: v for k, v in values.items() if k not in matrices})
    return {**scalars, **matrices}


def _expected_scalars(run: RunData) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(epoch, value)]`` for every non-null scalar, in epoch order, HParams metrics
    and the run's analyses (:mod:`fathom.export.analyses`) included."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in run.rows:
        for k, v in _row_values(row).items():
            if v is not None and not common.is_matrix(v):
                out.setdefault(k, []).append((int(row["epoch"]), float(v)))
    for tag, point in meta.metrics(run).items():
        out.setdefault(tag, []).append(point)
    for tag, points in run_analyses(run).points.items():
        out.setdefault(tag, []).extend(points)
    return out


def _row_walls(run: RunData) -> dict[int, float]:
    """The wall time each row's events carry, by epoch (:func:`fathom.export.common.wall_time`)."""
    walls, last = {}, 0.0
    for row in run.rows:
        last, _ = common.wall_time(row, last)
        walls[int(row["epoch"])] = last
    return walls


def _analysis_wall(walls: dict[int, float], epoch: int) -> float:
    """An analysis point's wall time: its epoch's row's, else the last row's before it (0 before any)."""
    before = [w for e, w in walls.items() if e <= epoch]
    return walls.get(epoch, before[-1] if before else 0.0)


def _write_analyses(writer: Any, run: RunData, described: set[str]) -> None:
    """The run's curvature and audit scalars, one event per tag and epoch (the epoch's wall time)."""
    from tensorboard.compat.proto.event_pb2 import Event

    walls = _row_walls(run)
    for tag, points in run_analyses(run).points.items():
        for epoch, v in points:
            summary = _summary_for({tag: v}, described)
            writer.add_event(
                Event(wall_time=_analysis_wall(walls, epoch), step=epoch, summary=summary)
            )


def _expected_matrices(run: RunData) -> dict[str, list[tuple[int, list[list[Any]]]]]:
    out: dict[str, list[tuple[int, list[list[Any]]]]] = {}
    for row in run.rows:
        for k, v in _row_values(row).items():
            if common.is_matrix(v):
                out.setdefault(k, []).append((int(row["epoch"]), v))
    return out


def _write_run(writer: Any, run: RunData) -> None:
    """Every row of one run, then its HParams session and metrics."""
    from tensorboard.compat.proto.event_pb2 import Event

    wall, described = 0.0, set()
    for row in run.rows:
        wall, _ = common.wall_time(row, wall)
        summary = _summary_for(_row_values(row), described)
        writer.add_event(Event(wall_time=wall, step=int(row["epoch"]), summary=summary))
    _write_analyses(writer, run, described)
    meta.write_session(writer, run, wall)


def write(runs: list[RunData], out: Path) -> tuple[list[str], dict[str, Any]]:
    """One event directory per run, plus the HParams experiment and the layout at ``out``."""
    require()
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    for run in runs:
        writer = EventFileWriter(str(out / run.run_id))
        try:
            _write_run(writer, run)
        finally:
            writer.close()
    before = set(out.glob("events.out.tfevents.*"))
    root = EventFileWriter(str(out), filename_suffix=".fathom")
    try:
        root.add_event(Event(wall_time=0.0, step=0, summary=meta.experiment_summary(runs)))
        root.add_event(Event(wall_time=0.0, step=0, summary=meta.layout_summary()[0]))
    finally:
        root.close()
    made = sorted(p.name for p in set(out.glob("events.out.tfevents.*")) - before)
    return [r.run_id for r in runs] + made, {}


def _same32(expected: float, got: float) -> bool:
    with np.errstate(over="ignore"):
        a, b = np.float32(expected), np.float32(got)
    return bool(np.isnan(a) and np.isnan(b)) or bool(a == b)


def verify(
    runs: list[RunData], out: Path, report: VerifyReport, *, events_dir: Path | None = None
) -> None:
    """Read ``out/<run_id>/`` back (``events_dir`` instead, for a single run's live log).

    Per run: exactly the written scalar steps and values (float32), every tag's registry
    description, every matrix as its exact float64 tensor and an image per row, the HParams
    session (hyperparameters equal to the config's leaves). For a post-hoc export, also the
    experiment record and the custom-scalars layout at ``out``.
    """
    require()
    if events_dir is not None and len(runs) != 1:
        raise FathomError("events_dir names one run's event directory; pass exactly one run")
    report.notes.append(
        "TensorBoard stores float32: values compared after rounding the source to float32"
    )
    stale = [r.run_id for r in runs if any(meta.WALL_FIELD not in row for row in r.rows)]
    if stale:
        report.notes.append(
            f"runs whose history predates {meta.WALL_FIELD} (wall time = elapsed seconds; use "
            f"TensorBoard's relative axis): {stale}"
        )
    for run in runs:
        report.runs += 1
        report.rows += len(run.rows)
        path = events_dir if events_dir is not None else out / run.run_id
        if not path.is_dir():
            report.mismatch(f"run {run.run_id}: no event directory {path}")
            continue
        report.notes += run_analyses(run).notes  # analyses left out, and why
        acc = _accumulator(path)
        _verify_scalars(run, acc, report)
        _verify_matrices(run, acc, report)
        _verify_session(run, acc, report)
    if events_dir is None:
        _verify_root(runs, out, report)


def _accumulator(path: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    acc.Reload()
    return acc


def _described(acc: Any, tag: str, report: VerifyReport, run_id: str) -> None:
    try:
        got = acc.SummaryMetadata(tag).summary_description
    except KeyError:
        got = None
    if got != meta.description(tag):
        report.mismatch(f"run {run_id} {tag}: the registry description is missing or differs")


def _verify_scalars(run: RunData, acc: Any, report: VerifyReport) -> None:
    tags = set(acc.Tags().get("scalars", []))
    expected = _expected_scalars(run)
    walls = _row_walls(run)  # the wall time each row's events were written with
    if tags != set(expected):
        report.mismatch(f"run {run.run_id}: tags differ {sorted(tags ^ set(expected))[:5]}")
    for tag, points in expected.items():
        if tag not in tags:
            continue
        _described(acc, tag, report, run.run_id)
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
        if not tag.startswith(f"{meta.METRIC_PREFIX}/") and [e.wall_time for e in events] != [
            _analysis_wall(walls, s) for s, _ in points
        ]:
            report.mismatch(f"run {run.run_id} {tag}: wall times are not the rows' own")


def _verify_matrices(run: RunData, acc: Any, report: VerifyReport) -> None:
    import numpy as np
    from tensorboard.util import tensor_util

    tensors = set(acc.Tags().get("tensors", [])) - {meta.SESSION_TAG}
    images = set(acc.Tags().get("images", []))
    expected = _expected_matrices(run)
    if tensors != set(expected) or images != {t + meta.IMAGE_SUFFIX for t in expected}:
        report.mismatch(f"run {run.run_id}: matrix tags differ from the history's matrix fields")
    for tag, points in expected.items():
        if tag not in tensors:
            continue
        _described(acc, tag, report, run.run_id)
        got = acc.Tensors(tag)
        shown = acc.Images(tag + meta.IMAGE_SUFFIX) if tag + meta.IMAGE_SUFFIX in images else []
        if [e.step for e in got] != [s for s, _ in points] or len(shown) != len(points):
            report.mismatch(f"run {run.run_id} {tag}: matrix steps or images differ")
            continue
        for (step, m), e in zip(points, got):
            report.values += 1
            if not np.array_equal(
                tensor_util.make_ndarray(e.tensor_proto), meta.matrix_array(m), equal_nan=True
            ):
                report.mismatch(f"run {run.run_id} {tag} step {step}: matrix differs")


def _verify_session(run: RunData, acc: Any, report: VerifyReport) -> None:
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = (
        acc.PluginTagToContent("hparams").get(meta.SESSION_TAG) if _has(acc, "hparams") else None
    )
    if content is None:
        report.mismatch(f"run {run.run_id}: no HParams session record")
        return
    data = plugin_data_pb2.HParamsPluginData.FromString(content)
    got = {k: _hparam_value(v) for k, v in data.session_start_info.hparams.items()}
    want = {
        k: (float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v)
        for k, v in meta.hparams(run).items()
    }
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        report.mismatch(f"run {run.run_id}: HParams differ from the config at {diff[:5]}")


def _has(acc: Any, plugin: str) -> bool:
    try:
        acc.PluginTagToContent(plugin)
    except KeyError:
        return False
    return True


def _hparam_value(v: Any) -> Any:
    kind = v.WhichOneof("kind")
    return getattr(v, kind) if kind else None


def _verify_root(runs: list[RunData], out: Path, report: VerifyReport) -> None:
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import metadata as cs
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = _accumulator(out)
    hp = acc.PluginTagToContent("hparams") if _has(acc, "hparams") else {}
    if meta.EXPERIMENT_TAG not in hp:
        report.mismatch("no HParams experiment record at the export's root")
    else:
        experiment = plugin_data_pb2.HParamsPluginData.FromString(
            hp[meta.EXPERIMENT_TAG]
        ).experiment
        names = {h.name for h in experiment.hparam_infos}
        wanted = {k for r in runs for k in meta.hparams(r)}
        metric_tags = {m.name.tag for m in experiment.metric_infos}
        if names != wanted or metric_tags != {t for r in runs for t in meta.metrics(r)}:
            report.mismatch(
                "the HParams experiment record does not list every hyperparameter and metric"
            )
    layout = (
        acc.Tensors(cs.CONFIG_SUMMARY_TAG)
        if cs.CONFIG_SUMMARY_TAG in acc.Tags().get("tensors", [])
        else []
    )
    from tensorboard.util import tensor_util

    if (
        len(layout) != 1
        or layout_pb2.Layout.FromString(tensor_util.make_ndarray(layout[0].tensor_proto).item())
        != meta.layout_summary()[1]
    ):
        report.mismatch("the custom-scalars layout at the export's root is missing or differs")


def read_back(runs: list[RunData], out: Path, record: dict[str, Any], report: VerifyReport) -> None:
    """:class:`fathom.export.backend.ExportBackend`'s read-back: :func:`verify`."""
    verify(runs, out, report)


def live_out(live: Any, run: Any) -> Path | None:
    """``<log_dir>/<study>/<run_id>`` with ``[live.tensorboard] log_dir`` (shared), else ``None``."""
    log_dir = live.tensorboard.log_dir
    if log_dir is None:
        return None
    return Path(log_dir) / str(run.study or "default") / run.run_dir.name


def live_sink(out: Path, live: Any, run: Any) -> Any:
    """The live sink: event files directly in ``out`` in a shared ``log_dir``, else per run."""
    shared = live.tensorboard.log_dir is not None
    return TensorBoardSink(out, out if shared else out / run.run_dir.name)


class TensorBoardSink:
    """The live sink (:class:`fathom.export.backend.LiveSink`): the export's events, one row
    at a time, into ``events_dir``, flushed after every row."""

    def __init__(self, out: Path, events_dir: Path) -> None:
        require()
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.out, self.events_dir = out, events_dir
        self.writer = EventFileWriter(str(events_dir))
        self.wall = 0.0
        self.described: set[str] = set()  # tags whose registry description is written

    def write(self, row: dict[str, Any], values: dict[str, Any]) -> None:
        """One row (``values`` is the flattened form W&B takes; TensorBoard keeps matrices)."""
        from tensorboard.compat.proto.event_pb2 import Event

        self.wall, _ = common.wall_time(row, self.wall)
        summary = _summary_for(_row_values(row), self.described)
        self.writer.add_event(Event(wall_time=self.wall, step=int(row["epoch"]), summary=summary))
        self.writer.flush()

    def close(self, run: Any) -> tuple[list[str], dict[str, Any]]:
        """The run's analyses and HParams session and metrics (known once it ends), then the paths."""
        if run is not None:  # None: no manifest was written (training failed to start)
            _write_analyses(self.writer, run, self.described)
            meta.write_session(self.writer, run, self.wall)
        self.writer.close()
        if self.events_dir == self.out:  # a shared log_dir: the event files themselves
            return sorted(p.name for p in self.out.glob("events.out.tfevents.*")), {}
        return [self.events_dir.relative_to(self.out).as_posix()], {}

    def verify(self, run: Any, out: Path, extra: dict[str, Any], report: VerifyReport) -> None:
        verify([run], out, report, events_dir=self.events_dir)
