"""W&B export in offline mode (``wandb sync <out>/wandb/offline-run-*`` uploads it later).

One W&B run per Fathom run: id = the run id (characters outside ``[A-Za-z0-9_-]``
replaced), name = the run id, group = the cohort, project = the study. Config: the run's
manifest config, hashes, environment, clocks and export metadata under ``fathom``.
Summary: ``fathom/status``, ``fathom/epochs_completed``, ``fathom/selected_epoch``,
``fathom/selected_val_ce`` and the manifest clocks as ``fathom/clock/<name>``.

History: one ``log`` per history row with ``step = epoch``, accuracy in percent under
``<name>_pct`` (:mod:`fathom.export.common`; the config's ``fathom.base.units`` states it); ``clock/training_s`` and
``clock/elapsed_s`` are logged values and declared metrics, to be chosen as x axes.
W&B's own ``_runtime`` and ``_timestamp`` measure the exporter, not training: they are
never a Fathom clock and verification ignores them. W&B silently drops a row whose step
is lower than the current one; rows are written in strictly increasing epoch order (the
reader removes repeats), and verification checks the step sequence read back.

Verification reads the ``.wandb`` file (:mod:`fathom.export.wandb_records`): the config
record, every history record (step and every key's ``value_json``, float64-exact, NaN
and infinities included) and the last summary value of each ``fathom/`` key.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fathom.base.io import json_safe
from fathom.config.live import WandbLiveConfig
from fathom.errors import FathomError, install_hint
from fathom.export.common import VerifyReport, export_scalars, same_value, units_table
from fathom.export.wandb_records import is_complete, read_records, wait_complete
from fathom.report.runs import RunData

DIR = "wandb"


def _wandb():
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
    m = run.manifest
    return {
        "fathom": json_safe(
            {
                "config": m.get("config"),
                "config_hash": m.get("config_hash"),
                "source_hash": m.get("source_hash"),
                "hashes": m.get("hashes"),
                "data": m.get("data"),
                "environment": m.get("environment"),
                "clocks": m.get("clocks"),
                "export": run.metadata(),
                "units": units_table([run]),
            }
        )
    }


def run_summary(run: RunData) -> dict[str, Any]:
    m = run.manifest
    selected = m.get("selected") or {}
    out = {
        "fathom/status": m.get("status"),
        "fathom/epochs_completed": m.get("epochs_completed"),
        "fathom/selected_epoch": selected.get("epoch"),
        "fathom/selected_val_ce": selected.get("val_ce"),
    }
    out.update({f"fathom/clock/{k}": v for k, v in (m.get("clocks") or {}).items()})
    return out


@contextlib.contextmanager
def wandb_env(out: Path, mode: str = "offline") -> Iterator[None]:
    """W&B's environment for one writer: ``mode``, quiet, its files under ``out``."""
    keys = {
        "WANDB_MODE": mode,
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(out),
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


def write(runs: list[RunData], out: Path) -> tuple[list[str], dict[str, Any]]:
    """Write one offline W&B run per Fathom run; return (paths, {run_id: .wandb path})."""
    wandb = _wandb()
    ids = [wandb_id(r.run_id) for r in runs]
    if len(set(ids)) != len(ids):
        raise FathomError(
            "two run ids map to the same W&B id; rename the runs so they differ in [A-Za-z0-9_-]"
        )
    files: dict[str, str] = {}
    settings = wandb.Settings(
        x_disable_stats=True,
        x_disable_machine_info=True,
        console="off",
        save_code=False,
        disable_git=True,
    )
    with wandb_env(out):
        for run, wid in zip(runs, ids):
            wrun = wandb.init(
                project=str(run.manifest.get("study") or "fathom"),
                id=wid,
                name=run.run_id,
                group=run.cohort,
                dir=str(out),
                mode="offline",
                config=run_config(run),
                settings=settings,
            )
            try:
                wrun.define_metric("epoch")
                wrun.define_metric("clock/training_s")
                wrun.define_metric("clock/elapsed_s")
                for row in run.rows:
                    values, _ = export_scalars(row)
                    wrun.log(values, step=int(row["epoch"]))
                wrun.summary.update(run_summary(run))
                sync_file = Path(wrun.settings.sync_file)
            finally:
                wrun.finish()
            wait_complete(sync_file)  # finish() may return before the file is whole
            files[run.run_id] = sync_file.relative_to(out).as_posix()
    return [DIR], {"wandb_files": files}


def _key(item: Any) -> str | None:
    if item.key:
        return item.key
    return item.nested_key[0] if len(item.nested_key) == 1 else None


def _value(text: str) -> Any:
    return json.loads(text)


def verify(runs: list[RunData], out: Path, record: dict[str, Any], report: VerifyReport) -> None:
    _wandb()
    files = record.get("wandb_files") or {}
    for run in runs:
        report.runs += 1
        rel = files.get(run.run_id)
        if rel is None or not (out / rel).exists():
            report.mismatch(f"run {run.run_id}: no .wandb file ({rel})")
            continue
        history: list[tuple[int, dict[str, Any]]] = []
        config: dict[str, Any] = {}
        summary: dict[str, Any] = {}
        records = read_records(out / rel)
        if not is_complete(records):
            report.mismatch(
                f"run {run.run_id}: {rel} has no exit record (W&B did not finish writing it); "
                "export again"
            )
            continue
        for rec in records:
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                items = {_key(i): _value(i.value_json) for i in rec.history.item}
                history.append((int(items.get("_step", rec.history.step.num)), items))
            elif kind == "config":
                config.update({_key(i): _value(i.value_json) for i in rec.config.update})
            elif kind == "run":
                config.update({_key(i): _value(i.value_json) for i in rec.run.config.update})
            elif kind == "summary":
                summary.update({_key(i): _value(i.value_json) for i in rec.summary.update})
        expected_config = json.loads(json.dumps(run_config(run)))
        for k, v in expected_config.items():
            if config.get(k) != v:
                report.mismatch(f"run {run.run_id}: config {k!r} differs from the manifest")
        for k, v in json_safe(run_summary(run)).items():
            report.values += 1
            if not same_value(v, summary.get(k)):
                report.mismatch(
                    f"run {run.run_id}: summary {k} wrote {v!r}, read {summary.get(k)!r}"
                )
        steps = [s for s, _ in history]
        epochs = [int(row["epoch"]) for row in run.rows]
        report.steps += len(steps)
        if steps != epochs:
            report.mismatch(f"run {run.run_id}: step sequence {steps} != epochs {epochs}")
        for row, (_, items) in zip(run.rows, history):
            report.rows += 1
            values, _ = export_scalars(row)
            got = {k: v for k, v in items.items() if k is not None and not k.startswith("_")}
            if set(got) != set(values):
                report.mismatch(
                    f"run {run.run_id} epoch {row['epoch']}: keys differ {sorted(set(got) ^ set(values))[:5]}"
                )
            for k, v in values.items():
                report.values += 1
                r = got.get(k)
                if not same_value(v, r) and not (v is None and r is None):
                    report.mismatch(
                        f"run {run.run_id} epoch {row['epoch']} {k}: wrote {v!r}, read {r!r}"
                    )
        nonfinite = sum(
            1
            for row in run.rows
            for v in export_scalars(row)[0].values()
            if isinstance(v, float) and not math.isfinite(v)
        )
        if nonfinite:
            report.notes.append(
                f"run {run.run_id}: {nonfinite} non-finite values written and read back as NaN/Infinity"
            )


def read_back(runs: list[RunData], out: Path, record: dict[str, Any], report: VerifyReport) -> None:
    """:class:`fathom.export.backend.ExportBackend`'s read-back: :func:`verify`."""
    verify(runs, out, record, report)


def require() -> None:
    """The live side (:class:`fathom.export.backend.LiveBackend`): refuse a missing wandb."""
    _wandb()


def live_out(live: Any, run: Any) -> Path | None:
    return None  # always RUN_DIR/live/wandb


def live_sink(out: Path, live: Any, run: Any) -> Any:
    return WandbSink(out, run.run_dir.name, run.study, run.cohort, live.wandb)


class WandbSink:
    """The live sink (:class:`fathom.export.backend.LiveSink`): each row logged to a W&B run
    (``step = epoch``) placed by the ``[live.wandb]`` settings, its files under ``out``."""

    def __init__(
        self, out: Path, run_id: str, study: str | None, cohort: str, settings: WandbLiveConfig
    ) -> None:
        self.wandb = _wandb()
        self.out, self.run_id = out, run_id
        with wandb_env(out, settings.mode):
            self.run = self.wandb.init(
                project=settings.project or str(study or "fathom"),
                entity=settings.entity,
                id=wandb_id(run_id),
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
        if run is not None:
            self.run.config.update(run_config(run), allow_val_change=True)
            self.run.summary.update(run_summary(run))
        sync_file = Path(self.run.settings.sync_file)
        self.run.finish()
        wait_complete(sync_file)
        rel = sync_file.relative_to(self.out).as_posix()
        return [DIR], {"wandb_files": {self.run_id: rel}}

    def verify(self, run: Any, out: Path, extra: dict[str, Any], report: VerifyReport) -> None:
        verify([run], out, {"wandb_files": extra["wandb_files"]}, report)
