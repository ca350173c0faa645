"""What the TensorBoard export writes beside the scalars: descriptions, matrices, HParams, layout.

- **Descriptions.** Every tag's first value carries its definition from the field registry
  (:func:`fathom.telemetry.registry.field_for`): formula, units, scope and caveats; an
  accuracy tag states the percent conversion; a key no registry entry declares says so.
- **Wall time.** An event's ``wall_time`` is the row's own timestamp ``clock/unix_s``
  (:data:`WALL_FIELD`); a history written before that field existed falls back to
  ``clock/elapsed_s`` and the export says so (TensorBoard's "relative" axis then reads right).
- **Matrices** (``kind = "matrix"`` fields, e.g. ``split/val/confusion``): one float64 tensor
  summary per row under the field's name (exact values, read back with ``Tensors``) and one
  grayscale PNG image ``<name>/image`` (each row scaled to its own sum: row-normalized
  confusion), instead of one scalar tag per entry.
- **HParams.** Each run's session-start record holds its hyperparameters as trained
  (:mod:`fathom.export.describe`: ``optim.lr``, ``model.recipe``, ``seed``, the widths after
  ``width_mult``, the parameter count; no ``data.data_dir`` or telemetry settings; lists as
  JSON text), and the metrics are scalar tags
  ``hparams/{selected,final}/{val,test}/{acc_pct,ce}``: the history row at the selected
  epoch (the manifest's ``selected.epoch``) and at the final one. The experiment record
  (every hyperparameter with its observed domain, every metric) and a custom-scalars
  layout (one category per split, accuracy and CE charts over every run) are written to
  the export's root directory.
"""

from __future__ import annotations

import math
import struct
import zlib
from typing import Any

from fathom.config.models import SPLITS
from fathom.errors import FathomError
from fathom.export.analyses import describe as describe_analysis
from fathom.export.common import PERCENT_SUFFIX, WALL_FIELD, accuracy_name
from fathom.report.runs import RunData

SESSION_TAG = "_hparams_/session_start_info"
EXPERIMENT_TAG = "_hparams_/experiment"
IMAGE_SUFFIX = "/image"
METRIC_PREFIX = "hparams"
_METRIC_SPLITS = ("val", "test")
_METRIC_FIELDS = ("acc", "ce")
PERCENT_NOTE = (
    "accuracy in percent: 100 x the fraction recorded in history.jsonl (fathom.base.units.percent)"
)


def _history_name(tag: str) -> str:
    """The history field an exported tag comes from (``val/acc_pct`` -> ``val/acc``)."""
    stripped = "/".join(p.removesuffix(PERCENT_SUFFIX) for p in tag.split("/"))
    return stripped if stripped != tag and accuracy_name(stripped) == tag else tag


def description(tag: str) -> str:
    """The registry's definition of the field behind ``tag``, as TensorBoard shows it."""
    from fathom.telemetry.registry import field_for

    if tag.startswith(f"{METRIC_PREFIX}/"):
        _, which, split, name = tag.split("/")
        epoch = "the validation-selected epoch" if which == "selected" else "the final epoch"
        return f"{description(f'{split}/{name}')} -- the history row at {epoch} (HParams metric)"
    analysis = describe_analysis(tag)
    if analysis is not None:
        return analysis
    name = _history_name(tag.removesuffix(IMAGE_SUFFIX))
    try:
        f = field_for(name)
    except FathomError:
        return f"{name}: not a declared Fathom field; exported as recorded in history.jsonl"
    units = PERCENT_NOTE if name != tag and not tag.endswith(IMAGE_SUFFIX) else f.units
    text = f"{f.formula} [{units}; scope: {f.scope}]"
    if tag.endswith(IMAGE_SUFFIX):
        text += " -- image: each row divided by its sum (white = 1), 0 for an empty row"
    return f"{text} {f.caveats}".strip()


def metadata(tag: str, plugin: str) -> Any:
    from tensorboard.compat.proto.summary_pb2 import SummaryMetadata

    unit = " (%)" if tag.endswith(PERCENT_SUFFIX) or f"{PERCENT_SUFFIX}/" in tag else ""
    return SummaryMetadata(
        display_name=f"{tag}{unit}",
        summary_description=description(tag),
        plugin_data=SummaryMetadata.PluginData(plugin_name=plugin),
    )


def matrix_array(value: list[list[Any]]) -> Any:
    import numpy as np

    return np.array([[math.nan if x is None else float(x) for x in r] for r in value], np.float64)


def _png_gray(pixels: Any) -> bytes:
    """A minimal 8-bit grayscale PNG of a 2-D uint8 array (no imaging library needed)."""
    h, w = pixels.shape
    raw = b"".join(b"\x00" + bytes(pixels[i].tolist()) for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def _matrix_image(m: Any, scale: int = 16) -> tuple[int, int, bytes]:
    """Row-normalized matrix as a PNG, each cell ``scale`` x ``scale`` pixels."""
    import numpy as np

    finite = np.where(np.isfinite(m), m, 0.0)
    sums = finite.sum(axis=1, keepdims=True)
    norm = np.divide(finite, sums, out=np.zeros_like(finite), where=sums > 0)
    pixels = np.clip(np.rint(norm * 255), 0, 255).astype(np.uint8)
    big = np.kron(pixels, np.ones((scale, scale), np.uint8))
    return big.shape[0], big.shape[1], _png_gray(big)


def matrix_values(tag: str, value: list[list[Any]], described: set[str]) -> list[Any]:
    """The tensor and image summary values of one matrix field (metadata on first use)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.util import tensor_util

    m = matrix_array(value)
    tensor = Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(m))
    h, w, png = _matrix_image(m)
    image = Summary.Value(
        tag=tag + IMAGE_SUFFIX,
        image=Summary.Image(height=h, width=w, colorspace=1, encoded_image_string=png),
    )
    for v, plugin in ((tensor, "tensors"), (image, "images")):
        if v.tag not in described:
            v.metadata.CopyFrom(metadata(v.tag, plugin))
            described.add(v.tag)
    return [tensor, image]


def hparams(run: RunData) -> dict[str, bool | int | float | str]:
    """The run's hyperparameters as trained (:func:`fathom.export.describe.hparams`: no file
    locations or observation settings, the widths after ``width_mult``)."""
    from fathom.export.describe import hparams as described

    return described(run)


def metrics(run: RunData) -> dict[str, tuple[int, float]]:
    """``hparams/{selected,final}/{split}/{acc_pct,ce}`` -> ``(epoch, value)``, export units."""
    from fathom.base.units import percent

    by_epoch = {int(r["epoch"]): r for r in run.rows}
    epochs = {
        "selected": run.recorded.selected.epoch,
        "final": run.recorded.final.epoch,
    }
    out: dict[str, tuple[int, float]] = {}
    for which, epoch in epochs.items():
        row = by_epoch.get(epoch) if isinstance(epoch, int) else None
        for split in _METRIC_SPLITS:
            for name in _METRIC_FIELDS:
                v = None if row is None else row.get(f"{split}/{name}")
                if not isinstance(v, int | float) or isinstance(v, bool):
                    continue
                key = f"{name}{PERCENT_SUFFIX}" if name == "acc" else name
                out[f"{METRIC_PREFIX}/{which}/{split}/{key}"] = (
                    int(epoch),
                    percent(v) if name == "acc" else float(v),
                )
    return out


def session_summary(run: RunData) -> Any:
    """The run's HParams session-start record (``trial_id`` = run id)."""
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb

    return hparams_pb(hparams(run), trial_id=run.run_id, start_time_secs=_start_time(run))


def _start_time(run: RunData) -> float | None:
    for row in run.rows:
        v = row.get(WALL_FIELD)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    return None


def experiment_summary(runs: list[RunData]) -> Any:
    """Every hyperparameter with its observed domain, and every metric tag."""
    from tensorboard.plugins.hparams import summary_v2 as hp

    values: dict[str, set] = {}
    for run in runs:
        for k, v in hparams(run).items():
            values.setdefault(k, set()).add(v)
    params = []
    for k in sorted(values):
        vs = values[k]
        kinds = {type(v) for v in vs}
        if (len(kinds) == 1 and kinds <= {bool, str}) or (
            kinds <= {int, float} and bool not in kinds
        ):
            domain = hp.Discrete(sorted(vs))
        else:  # mixed types: no domain (TensorBoard infers one)
            domain = None
        params.append(hp.HParam(k, domain))
    tags = sorted({t for run in runs for t in metrics(run)})
    return hp.hparams_config_pb(
        params, [hp.Metric(t, display_name=t, description=description(t)) for t in tags]
    )


def layout_summary() -> Any:
    """A custom-scalars layout: one category per split, accuracy and CE of every run."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import metadata as cs
    from tensorboard.util import tensor_util

    layout = layout_pb2.Layout(
        category=[
            layout_pb2.Category(
                title=split,
                chart=[
                    layout_pb2.Chart(
                        title=f"{split} {title}",
                        multiline=layout_pb2.MultilineChartContent(tag=[rf"^{split}/{tag}$"]),
                    )
                    for tag, title in (
                        (f"acc{PERCENT_SUFFIX}", "accuracy (%)"),
                        ("ce", "CE (nats)"),
                    )
                ],
            )
            for split in SPLITS
        ]
    )
    value = Summary.Value(
        tag=cs.CONFIG_SUMMARY_TAG,
        tensor=tensor_util.make_tensor_proto(layout.SerializeToString(), dtype="string"),
    )
    value.metadata.CopyFrom(cs.create_summary_metadata())
    return Summary(value=[value]), layout


def write_session(writer: Any, run: RunData, wall: float) -> None:
    """The run's HParams session record and its metric scalars (post-hoc and live alike)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    start = _start_time(run)
    writer.add_event(Event(wall_time=start or wall, step=0, summary=session_summary(run)))
    for tag, (epoch, v) in metrics(run).items():
        value = Summary.Value(tag=tag, simple_value=v)
        value.metadata.CopyFrom(metadata(tag, "scalars"))
        writer.add_event(Event(wall_time=wall, step=epoch, summary=Summary(value=[value])))
