"""The two live sinks (:class:`fathom.export.backend.LiveSink`) of the TensorBoard and W&B
backends, one row at a time.

``TensorBoardSink`` writes event files (the export's :func:`summary_for`, accuracy's unit
stated on its first value) into ``events_dir`` and flushes after every row;
``WandbSink`` logs each row to a W&B run (``step = epoch``) placed by the ``[live.wandb]``
settings (:class:`fathom.config_live.WandbLiveConfig`), its files under ``out``. Both return,
on ``close(run)``, the paths they wrote (relative to ``out``) and the export record's extra
fields, and ``verify`` with the export's own read-back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fathom.config_live import WandbLiveConfig
from fathom.export.common import VerifyReport


class TensorBoardSink:
    def __init__(self, out: Path, events_dir: Path) -> None:
        from fathom.export.tensorboard_export import require

        require()
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.out, self.events_dir = out, events_dir
        self.writer = EventFileWriter(str(events_dir))
        self.wall = 0.0
        self.described: set[str] = set()  # tags whose registry description is written

    def write(self, row: dict[str, Any], values: dict[str, Any]) -> None:
        """One row (``values`` is the flattened form W&B takes; TensorBoard keeps matrices)."""
        from tensorboard.compat.proto.event_pb2 import Event

        from fathom.export import tensorboard_meta as meta
        from fathom.export.tensorboard_export import row_values, summary_for

        self.wall, _ = meta.wall_time(row, self.wall)
        summary = summary_for(row_values(row), self.described)
        self.writer.add_event(Event(wall_time=self.wall, step=int(row["epoch"]), summary=summary))
        self.writer.flush()

    def close(self, run: Any) -> tuple[list[str], dict[str, Any]]:
        """The run's HParams session and metrics (known once it ends), then the paths."""
        from fathom.export.tensorboard_meta import write_session

        write_session(self.writer, run, self.wall)
        self.writer.close()
        if self.events_dir == self.out:  # a shared log_dir: the event files themselves
            return sorted(p.name for p in self.out.glob("events.out.tfevents.*")), {}
        return [self.events_dir.relative_to(self.out).as_posix()], {}

    def verify(self, run: Any, out: Path, extra: dict[str, Any], report: VerifyReport) -> None:
        from fathom.export.tensorboard_export import verify

        verify([run], out, report, events_dir=self.events_dir)


class WandbSink:
    def __init__(
        self, out: Path, run_id: str, study: str | None, cohort: str, settings: WandbLiveConfig
    ) -> None:
        from fathom.export import wandb_export

        self.wandb = wandb_export._wandb()
        self.out, self.run_id = out, run_id
        with wandb_export.wandb_env(out, settings.mode):
            self.run = self.wandb.init(
                project=settings.project or str(study or "fathom"),
                entity=settings.entity,
                id=wandb_export.wandb_id(run_id),
                name=run_id,
                group=cohort,
                dir=str(out),
                mode=settings.mode,
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

    def verify(self, run: Any, out: Path, extra: dict[str, Any], report: VerifyReport) -> None:
        from fathom.export.wandb_export import verify

        verify([run], out, {"wandb_files": extra["wandb_files"]}, report)
