"""TensorBoard event content shared by the post-hoc export and the live sink
(:mod:`fathom.export.tensorboard_export`): one history row as a ``Summary`` (accuracy's unit
and every tag's registry description on its first value), the values a read-back expects,
and one run written into an event file."""

from __future__ import annotations

from typing import Any

from fathom.errors import FathomError, install_hint
from fathom.export import common
from fathom.export import tensorboard_meta as meta
from fathom.export.analyses import run_analyses
from fathom.export.common import flatten_row, in_export_units
from fathom.report.runs import RunData


def require() -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise FathomError(
            "the TensorBoard export needs the tensorboard package, which is not installed; install the "
            f"extra with `{install_hint('tensorboard')}`"
        ) from None


def summary_for(values: dict[str, Any], described: set[str]) -> Any:
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


def row_values(row: dict[str, Any]) -> dict[str, Any]:
    """A row in export units: matrices kept whole, every other field flattened to scalars."""
    values = in_export_units(row)
    values.pop(meta.WALL_FIELD, None)  # it is the event's wall time (float64), not a float32 scalar
    matrices = {k: v for k, v in values.items() if common.is_matrix(v)}
    scalars, _ = flatten_row({k: v for k, v in values.items() if k not in matrices})
    return {**scalars, **matrices}


def expected_scalars(run: RunData) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(epoch, value)]`` for every non-null scalar, in epoch order, HParams metrics
    and the run's analyses (:mod:`fathom.export.analyses`) included."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in run.rows:
        for k, v in row_values(row).items():
            if v is not None and not common.is_matrix(v):
                out.setdefault(k, []).append((int(row["epoch"]), float(v)))
    for tag, point in meta.metrics(run).items():
        out.setdefault(tag, []).append(point)
    for tag, points in run_analyses(run).points.items():
        out.setdefault(tag, []).extend(points)
    return out


def row_walls(run: RunData) -> dict[int, float]:
    """The wall time each row's events carry, by epoch (:func:`fathom.export.common.wall_time`)."""
    walls, last = {}, 0.0
    for row in run.rows:
        last, _ = common.wall_time(row, last)
        walls[int(row["epoch"])] = last
    return walls


def analysis_wall(walls: dict[int, float], epoch: int) -> float:
    """An analysis point's wall time: its epoch's row's, else the last row's before it (0 before any)."""
    before = [w for e, w in walls.items() if e <= epoch]
    return walls.get(epoch, before[-1] if before else 0.0)


def write_analyses(writer: Any, run: RunData, described: set[str]) -> None:
    """The run's curvature and audit scalars, one event per tag and epoch (the epoch's wall time)."""
    from tensorboard.compat.proto.event_pb2 import Event

    walls = row_walls(run)
    for tag, points in run_analyses(run).points.items():
        for epoch, v in points:
            summary = summary_for({tag: v}, described)
            writer.add_event(
                Event(wall_time=analysis_wall(walls, epoch), step=epoch, summary=summary)
            )


def expected_matrices(run: RunData) -> dict[str, list[tuple[int, list[list[Any]]]]]:
    out: dict[str, list[tuple[int, list[list[Any]]]]] = {}
    for row in run.rows:
        for k, v in row_values(row).items():
            if common.is_matrix(v):
                out.setdefault(k, []).append((int(row["epoch"]), v))
    return out


def write_run(writer: Any, run: RunData) -> None:
    """Every row of one run, then its HParams session and metrics."""
    from tensorboard.compat.proto.event_pb2 import Event

    wall, described = 0.0, set()
    for row in run.rows:
        wall, _ = common.wall_time(row, wall)
        summary = summary_for(row_values(row), described)
        writer.add_event(Event(wall_time=wall, step=int(row["epoch"]), summary=summary))
    write_analyses(writer, run, described)
    meta.write_session(writer, run, wall)
