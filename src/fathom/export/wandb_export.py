"""W&B export in offline mode (``wandb sync <out>/wandb/offline-run-*`` uploads it later).

One W&B run per Fathom run: id = the run id (characters outside ``[A-Za-z0-9_-]``
replaced), name = the run id, project = the study, group = the cohort (recipe and learning
rate: the runs that differ only by seed), job type = the phase (``train``, or ``tuning`` for
a study's learning-rate grid), tags = model kind, recipe, dataset, status and the config's
own tags (:mod:`fathom.export.describe`).

Config, nested as the run's config is: every section at the top (``model.recipe``,
``optim.lr``, ``data.dataset`` in W&B's table), ``trained`` what the config became in the
run (the widths after ``width_mult``, the parameter count, the device and execution path
used: :func:`fathom.export.describe.as_trained`), and ``fathom`` the provenance (config and
source hashes, parameter hashes, data, environment, clocks, export metadata, units).
Summary: ``fathom/status``, ``fathom/epochs_completed``, ``fathom/selected_epoch``,
``fathom/selected_val_ce`` and the manifest clocks as ``fathom/clock/<name>``.

History: one ``log`` per history row with ``step = epoch`` and ``_timestamp`` = the row's
own Unix time (:func:`fathom.export.common.wall_time`: ``clock/unix_s``, the elapsed
seconds for a history older than that field), so W&B's wall-clock axis shows when the run
trained, not when it was exported. Scalars in export units (accuracy in percent under
``<name>_pct``); ``clock/training_s`` and ``clock/elapsed_s`` are logged values and declared
metrics, Fathom's relative axes (W&B's own ``_runtime`` is measured by the exporting process
and cannot be set: it is never a Fathom clock). A matrix field is one W&B table per row,
``<name>_table``: a confusion matrix in the columns of W&B's confusion-matrix chart
(``Actual``, ``Predicted``, ``nPredictions``, drawn with that chart), any other matrix as
``row``, ``column``, ``value``. The run's curvature and audit results
(:mod:`fathom.export.analyses`, the same ``curvature/...`` and ``audit/...`` scalars as
TensorBoard's) are logged with the row of the epoch they describe. W&B silently drops a row whose step is lower than the current
one; rows are written in strictly increasing epoch order (the reader removes repeats).

Checkpoints (``fathom export --to wandb --checkpoints``): every checkpoint the manifest lists,
its file checked against the recorded SHA-256 first, as a version of the artifact
``model-<id>`` (type ``model``, the file referenced where it lies, not copied), aliased
``epoch-<N>`` and ``selected`` / ``final`` where it is that epoch, its epoch and hashes in
the artifact's metadata.

W&B's own files (tables' staging copies, logs) go to ``<out>/wandb-data``, never the
user's home: ``wandb sync`` reads them. Verification: :mod:`fathom.export.wandb_verify`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fathom.config.live import WandbLiveConfig
from fathom.errors import FathomError
from fathom.export.common import wall_time
from fathom.export.describe import job_type, run_tags
from fathom.export.wandb_content import (
    CHART,
    GENERIC_COLUMNS,
    TABLE_SUFFIX,
    analyses_by_epoch,
    checked_checkpoints,
    columns,
    row_values,
    run_config,
    run_summary,
    table_rows,
    wandb_id,
    wandb_module,
)
from fathom.export.wandb_records import wait_complete
from fathom.export.wandb_verify import verify
from fathom.report.runs import RunData

DIR = "wandb"
_DATA_DIR = "wandb-data"


def _log_row(
    wandb: Any, wrun: Any, row: dict[str, Any], wall: float, more: dict[str, float] | None = None
) -> None:
    """One history row as one ``log`` at ``step = epoch`` stamped ``_timestamp = wall``
    (``more``: the analyses' scalars at that epoch)."""
    scalars, matrices = row_values(row)
    data: dict[str, Any] = {**scalars, **(more or {})}
    for name, m in matrices.items():
        cols = columns(name)
        table = wandb.Table(columns=list(cols), data=table_rows(m))
        if cols == GENERIC_COLUMNS:
            data[name + TABLE_SUFFIX] = table
        else:  # W&B logs the chart's table under <name>_table
            data[name] = wandb.plot_table(CHART, table, {c: c for c in cols}, {"title": name})
    data["_timestamp"] = wall
    wrun.log(data, step=int(row["epoch"]))


@contextlib.contextmanager
def _wandb_env(out: Path, mode: str = "offline") -> Iterator[None]:
    """W&B's environment for one writer: ``mode``, quiet, its files under ``out``."""
    data = out / _DATA_DIR
    keys = {
        "WANDB_MODE": mode,
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(out),
        "WANDB_DATA_DIR": str(data),
        "WANDB_CACHE_DIR": str(data / "cache"),
        "WANDB_ARTIFACT_DIR": str(data / "artifacts"),
        "WANDB_CONSOLE": "off",
    }
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def settings(wandb: Any) -> Any:
    return wandb.Settings(
        x_disable_stats=True,
        x_disable_machine_info=True,
        console="off",
        save_code=False,
        disable_git=True,
    )


def _log_checkpoints(wandb: Any, wrun: Any, run: RunData, wid: str) -> list[dict[str, Any]]:
    """Every checkpoint as a version of ``model-<wid>`` (module docstring); what was logged."""
    logged = checked_checkpoints(run)
    for c in logged:
        art = wandb.Artifact(
            f"model-{wid}",
            type="model",
            metadata={
                "run_id": run.run_id,
                **{k: c[k] for k in ("epoch", "sha256", "params_sha256")},
            },
        )
        art.add_file(
            str(run.path / c["file"]),
            name=Path(c["file"]).name,
            policy="immutable",
            skip_cache=True,
        )
        wrun.log_artifact(art, aliases=c["aliases"])
    return logged


def write(
    runs: list[RunData], out: Path, *, checkpoints: bool = False
) -> tuple[list[str], dict[str, Any]]:
    """Write one offline W&B run per Fathom run; return (paths, {run_id: .wandb path}, and the
    artifacts logged when ``checkpoints``)."""
    wandb = wandb_module()
    ids = [wandb_id(r.run_id) for r in runs]
    if len(set(ids)) != len(ids):
        raise FathomError(
            "two run ids map to the same W&B id; rename the runs so they differ in [A-Za-z0-9_-]"
        )
    files: dict[str, str] = {}
    artifacts: dict[str, list[dict[str, Any]]] = {}
    with _wandb_env(out):
        for run, wid in zip(runs, ids):
            wrun = wandb.init(
                project=str(run.recorded.study or "fathom"),
                id=wid,
                name=run.run_id,
                group=run.cohort,
                job_type=job_type(run),
                tags=run_tags(run),
                dir=str(out),
                mode="offline",
                config=run_config(run),
                settings=settings(wandb),
            )
            try:
                for metric in ("epoch", "clock/training_s", "clock/elapsed_s"):
                    wrun.define_metric(metric)
                wall, analyses = 0.0, analyses_by_epoch(run)[0]
                for row in run.rows:
                    wall, _ = wall_time(row, wall)
                    _log_row(wandb, wrun, row, wall, analyses.get(int(row["epoch"])))
                wrun.summary.update(run_summary(run))
                if checkpoints:
                    artifacts[run.run_id] = _log_checkpoints(wandb, wrun, run, wid)
                sync_file = Path(wrun.settings.sync_file)
            finally:
                wrun.finish()
            wait_complete(sync_file)  # finish() may return before the file is whole
            files[run.run_id] = sync_file.relative_to(out).as_posix()
    extra: dict[str, Any] = {"wandb_files": files}
    if checkpoints:
        extra["wandb_artifacts"] = artifacts
    return [DIR, _DATA_DIR], extra


def read_back(runs: list[RunData], out: Path, record: dict[str, Any], report: Any) -> None:
    """:class:`fathom.export.backend.ExportBackend`'s read-back: :func:`fathom.export.wandb_verify.verify`."""
    verify(runs, out, record, report)


def require() -> None:
    """The live side (:class:`fathom.export.backend.LiveBackend`): refuse a missing wandb."""
    wandb_module()


def live_out(live: Any, run: Any) -> Path | None:
    return None  # always RUN_DIR/live/wandb


def live_sink(out: Path, live: Any, run: Any) -> Any:
    return WandbSink(out, run.run_dir.name, run.study, run.cohort, live.wandb)


class WandbSink:
    """The live sink (:class:`fathom.export.backend.LiveSink`): each row logged to a W&B run
    (``step = epoch``, ``_timestamp`` the row's own) placed by the ``[live.wandb]`` settings,
    its files under ``out``; tags, config and summary set from the finished run."""

    def __init__(
        self, out: Path, run_id: str, study: str | None, cohort: str, live: WandbLiveConfig
    ) -> None:
        self.wandb = wandb_module()
        self.out, self.run_id, self.mode, self.wall = out, run_id, live.mode, 0.0
        with _wandb_env(out, live.mode):
            self.run = self.wandb.init(
                project=live.project or str(study or "fathom"),
                entity=live.entity,
                id=wandb_id(run_id),
                name=run_id,
                group=cohort,
                job_type="train",
                dir=str(out),
                mode=live.mode,
                settings=settings(self.wandb),
            )
        for metric in ("epoch", "clock/training_s", "clock/elapsed_s"):
            self.run.define_metric(metric)

    def write(self, row: dict[str, Any], values: dict[str, Any]) -> None:
        """One row (``values``, the flattened form, is not used: matrices become tables)."""
        self.wall, _ = wall_time(row, self.wall)
        with _wandb_env(self.out, self.mode):
            _log_row(self.wandb, self.run, row, self.wall)

    def close(self, run: Any) -> tuple[list[str], dict[str, Any]]:
        if run is not None:
            self.run.config.update(run_config(run), allow_val_change=True)
            self.run.tags = tuple(run_tags(run))
            self.run.summary.update(run_summary(run))
        sync_file = Path(self.run.settings.sync_file)
        with _wandb_env(self.out, self.mode):
            self.run.finish()
        wait_complete(sync_file)
        rel = sync_file.relative_to(self.out).as_posix()
        return [DIR, _DATA_DIR], {"wandb_files": {self.run_id: rel}}

    def verify(self, run: Any, out: Path, extra: dict[str, Any], report: Any) -> None:
        verify(
            [run], out, {"wandb_files": extra["wandb_files"]}, report, job="train", analyses=False
        )
