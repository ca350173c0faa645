"""Live tracking: stream a run's history rows to TensorBoard and W&B while it trains.

An observer of the trainer's row events (the ``progress(event, info)`` callback of
:func:`fathom.train.loop.train`). It never reads the trainer's memory: on every event it
reads the lines appended to ``history.jsonl`` since the last event and writes exactly those
rows, so the live logs hold the same rows as the run directory (the divergence row
included, read when the tracker closes). It runs between epochs, outside the training
clock (which times optimizer steps only) and after the row is on disk; it only reads the
run directory, so parameters, optimizer state and the training RNG are untouched.

Layout, one per run and target (the export formats, :mod:`fathom.export.tensorboard_export`
and :mod:`fathom.export.wandb_export`)::

    <run_dir>/live/tensorboard/<run_id>/events.out.tfevents.*   tensorboard --logdir <study dir>
    <run_dir>/live/wandb/wandb/offline-run-*/                    wandb sync <that dir>
    <run_dir>/live/<target>/fathom-export.json, verify.json

Each invocation starts the live logs afresh from the first row (a resumed run streams its
earlier rows again, then the new ones). W&B runs offline (no server, no account); its
config and summary are set from the final manifest when the tracker closes. On close the
logs are verified by the same read-back as the exports, against the run directory.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fathom.errors import FathomError
from fathom.export.common import (
    VerifyReport,
    accuracy_name,
    export_scalars,
    fingerprint,
    write_record,
)
from fathom.io import atomic_write_json

LIVE_TARGETS = ("tensorboard", "wandb")
LIVE_DIR = "live"

Observer = Callable[[str, dict[str, Any]], None]


def parse_live(text: str | None) -> tuple[str, ...]:
    """``"tensorboard,wandb"`` -> ``("tensorboard", "wandb")``; ``None``/``""`` -> ``()``."""
    if not text:
        return ()
    targets = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in targets if t not in LIVE_TARGETS]
    if bad:
        raise FathomError(
            f"unknown live target(s) {bad}; use a comma-separated list of {', '.join(LIVE_TARGETS)}"
        )
    return targets


def fan_out(*observers: Observer | None) -> Observer | None:
    """One callback calling every given observer in order (``None`` entries are skipped)."""
    active = [o for o in observers if o is not None]
    if not active:
        return None
    if len(active) == 1:
        return active[0]

    def call(event: str, info: dict[str, Any]) -> None:
        for o in active:
            o(event, info)

    return call


class _TensorBoardSink:
    def __init__(self, out: Path, run_id: str) -> None:
        from fathom.export.tensorboard_export import _require

        _require()
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(out / run_id))
        self.wall = 0.0
        self.described: set[str] = set()  # accuracy tags whose unit is written

    def write(self, row: dict[str, Any], values: dict[str, Any]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        from fathom.export.tensorboard_export import summary_for

        elapsed = row.get("clock/elapsed_s")
        if isinstance(elapsed, int | float) and math.isfinite(elapsed):
            self.wall = float(elapsed)
        pending = {n for k in row if (n := accuracy_name(k)) is not None} - self.described
        self.described |= pending
        summary = summary_for(values, pending)
        self.described -= pending  # tags without a value in this row are described later
        self.writer.add_event(Event(wall_time=self.wall, step=int(row["epoch"]), summary=summary))
        self.writer.flush()

    def close(self, run: Any) -> tuple[list[str], dict[str, Any]]:
        self.writer.close()
        return [run.run_id], {}


class _WandbSink:
    def __init__(self, out: Path, run_id: str, study: str | None, cohort: str) -> None:
        from fathom.export import wandb_export

        self.wandb = wandb_export._wandb()
        self.out, self.run_id = out, run_id
        with wandb_export._offline_env(out):
            self.run = self.wandb.init(
                project=str(study or "fathom"),
                id=wandb_export.wandb_id(run_id),
                name=run_id,
                group=cohort,
                dir=str(out),
                mode="offline",
                settings=self.wandb.Settings(
                    x_disable_stats=True,
                    x_disable_machine_info=True,
                    console="off",
                    save_code=False,
                    disable_git=True,
                ),
            )
        for metric in ("epoch", "clock/training_s", "clock/elapsed_s"):
            self.run.define_metric(metric)

    def write(self, row: dict[str, Any], values: dict[str, Any]) -> None:
        self.run.log(values, step=int(row["epoch"]))

    def close(self, run: Any) -> tuple[list[str], dict[str, Any]]:
        from fathom.export import wandb_export

        if run is not None:
            self.run.config.update(wandb_export.run_config(run), allow_val_change=True)
            self.run.summary.update(wandb_export.run_summary(run))
        sync_file = Path(self.run.settings.sync_file)
        self.run.finish()
        rel = sync_file.relative_to(self.out).as_posix()
        return [wandb_export.DIR], {"wandb_files": {self.run_id: rel}}


class LiveTracker:
    """The observer: pass it (or :func:`fan_out` of it and a display) as ``progress``.

    ``close()`` after training (also after an error) streams the last rows, finishes the
    logs and returns one :class:`~fathom.export.common.VerifyReport` per target. ``config``
    (the run's :class:`~fathom.config.RunConfig`) names the W&B project and group before the
    trainer's first manifest exists, so the epoch-0 row is streamed at once; without it the
    tracker waits for the manifest.
    """

    def __init__(self, run_dir: str | Path, targets: Sequence[str], config: Any = None) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.targets = tuple(targets)
        for t in self.targets:
            if t not in LIVE_TARGETS:
                raise FathomError(f"unknown live target {t!r}; use {', '.join(LIVE_TARGETS)}")
        if "tensorboard" in self.targets:
            from fathom.export.tensorboard_export import _require

            _require()  # a missing package is reported before training starts
        if "wandb" in self.targets:
            from fathom.export.wandb_export import _wandb

            _wandb()
        self.sinks: dict[str, Any] = {}
        self.offset = 0
        self.last_epoch: int | None = None
        self.rows = 0
        self.error: str | None = None

    def out(self, target: str) -> Path:
        """``<run_dir>/live/<target>``."""
        return self.run_dir / LIVE_DIR / target

    def _config(self) -> dict[str, Any] | None:
        """The run's config: from the manifest once written, else the one given."""
        path = self.run_dir / "manifest.json"
        if path.exists():
            return json.loads(path.read_text()).get("config") or {}
        if self.config is None:
            return None
        return self.config if isinstance(self.config, dict) else self.config.model_dump(mode="json")

    def _open(self, config: dict[str, Any]) -> None:
        run_id = self.run_dir.name  # the trainer's run id (manifest "run_id")
        recipe = (config.get("model") or {}).get("recipe", "unknown")
        lr = (config.get("optim") or {}).get("lr")
        cohort = recipe if lr is None else f"{recipe} lr={lr:g}"
        for target in self.targets:
            out = self.out(target)
            if out.exists():
                shutil.rmtree(out)  # each invocation streams the whole history afresh
            out.mkdir(parents=True)
            if target == "tensorboard":
                self.sinks[target] = _TensorBoardSink(out, run_id)
            else:
                self.sinks[target] = _WandbSink(out, run_id, config.get("study"), cohort)

    def _new_rows(self) -> list[dict[str, Any]]:
        """Complete lines appended to history.jsonl since the last read (a torn tail waits)."""
        path = self.run_dir / "history.jsonl"
        if not path.exists():
            return []
        with open(path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        rows = []
        for line in data[:end].decode("utf-8").splitlines():
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a torn line is flagged by the read-back, never streamed
        return rows

    def poll(self) -> int:
        """Stream the rows appended since the last call; returns how many were written."""
        if not self.sinks and self.targets:
            config = self._config()
            if config is None or not (self.run_dir / "history.jsonl").exists():
                return 0
            self._open(config)
        written = 0
        for row in self._new_rows():
            epoch = row.get("epoch")
            if isinstance(epoch, bool) or not isinstance(epoch, int):
                continue
            if self.last_epoch is not None and epoch <= self.last_epoch:
                continue  # W&B refuses a step that does not increase; the read-back flags it
            values, _ = export_scalars(row)
            for sink in self.sinks.values():
                sink.write(row, values)
            self.last_epoch, written = epoch, written + 1
        self.rows += written
        return written

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        """The trainer's callback: stream new rows; a failing log never stops training."""
        if self.error is not None:
            return
        try:
            self.poll()
        except Exception as e:  # the logs are secondary: report at close, keep training
            self.error = (
                f"live tracking stopped at epoch {self.last_epoch}: {type(e).__name__}: {e}"
            )

    def close(self) -> list[VerifyReport]:
        """Stream what is left, finish every log, write its record and verify it by reading back."""
        from fathom.export import tensorboard_export, wandb_export
        from fathom.export.run import VERIFY_FILE
        from fathom.report.runs import load_runs

        if self.error is None:
            self.poll()
        run = load_runs(self.run_dir)[0] if (self.run_dir / "manifest.json").exists() else None
        reports = []
        for target, sink in self.sinks.items():
            out = self.out(target)
            paths, extra = sink.close(run)
            if run is None:
                continue
            write_record(
                out,
                target,
                self.run_dir,
                [run],
                fingerprint(target, [run]),
                [*paths, VERIFY_FILE],
                extra,
            )
            report = VerifyReport(target=f"live {target}", out=out)
            if self.error is not None:
                report.mismatch(self.error)
            if target == "tensorboard":
                tensorboard_export.verify([run], out, report)
            else:
                wandb_export.verify([run], out, {"wandb_files": extra["wandb_files"]}, report)
            atomic_write_json(out / VERIFY_FILE, report.to_dict())
            reports.append(report)
        self.sinks = {}
        return reports
