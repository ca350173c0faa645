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
    <log_dir>/<study>/<run_id>/events.out.tfevents.*            with [live.tensorboard] log_dir
    <run_dir>/live/wandb/wandb/offline-run-*/                    wandb sync <that dir>
    <each of those>/fathom-live.json, fathom-export.json, verify.json

Settings come from the ``[live]`` config section (:mod:`fathom.config_live`), with the
CLI's ``--live`` choosing the backends. Each invocation starts the live logs afresh from
the first row (a resumed run streams its earlier rows again, then the new ones); in a
shared ``log_dir`` it replaces only a directory whose ``fathom-live.json`` names this run
directory. W&B runs offline by default (no server, no account); its config and summary are
set from the final manifest when the tracker closes. On close the logs are verified by the
same read-back as the exports, against the run directory.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fathom.config_live import BACKENDS, LiveConfig, live_config
from fathom.errors import FathomError
from fathom.export.common import (
    VerifyReport,
    export_scalars,
    fingerprint,
    write_record,
)
from fathom.export.live_sinks import TensorBoardSink, WandbSink
from fathom.io import atomic_write_json
from fathom.terminal import OnProgress

LIVE_TARGETS = BACKENDS
LIVE_DIR = "live"
MARKER = "fathom-live.json"
"""Written first into every live log directory: the run directory it belongs to."""


def parse_live(text: str | None) -> tuple[str, ...]:
    """``"tensorboard,wandb"`` -> ``("tensorboard", "wandb")``; ``None``, ``""``, ``"off"`` -> ``()``."""
    if not text or text.strip() == "off":
        return ()
    targets = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in targets if t not in LIVE_TARGETS]
    if bad:
        raise FathomError(
            f"unknown live target(s) {bad}; use a comma-separated list of {', '.join(LIVE_TARGETS)}"
        )
    return targets


def _check_log_dir(out: Path, run_dir: Path) -> None:
    """Refuse to replace a directory that is not this run's live log (a shared ``log_dir``)."""
    if not out.exists() or not any(out.iterdir()):
        return
    marker = out / MARKER
    owner = json.loads(marker.read_text()).get("run_dir") if marker.exists() else None
    if owner != str(run_dir.resolve()):
        what = f"the live log of {owner}" if owner else "files that are not a Fathom live log"
        raise FathomError(
            f"{str(out)!r} holds {what}; each invocation replaces its own live log only: "
            "choose another [live.tensorboard] log_dir or remove that directory"
        )


def fan_out(*observers: OnProgress | None) -> OnProgress | None:
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


class LiveTracker:
    """The observer: pass it (or :func:`fan_out` of it and a display) as ``progress``.

    ``live``: the run's :class:`~fathom.config_live.LiveConfig` (or a list of backends, with
    the default settings). ``close()`` after training (also after an error) streams the last
    rows, finishes the logs and returns one :class:`~fathom.export.common.VerifyReport` per
    backend. ``config`` (the run's :class:`~fathom.config.RunConfig`) names the study, W&B
    project and group before the trainer's first manifest exists, so the epoch-0 row is
    streamed at once and a shared TensorBoard ``log_dir`` is checked before training;
    without it the tracker waits for the manifest.
    """

    def __init__(
        self, run_dir: str | Path, live: LiveConfig | Sequence[str], config: Any = None
    ) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.live = live = live_config(live)
        self.targets: tuple[str, ...] = live.backends
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
        self.study: str | None = None
        known = self._config()
        if known is not None and "tensorboard" in self.targets:
            self._check("tensorboard", self.out("tensorboard", known.get("study")))

    def out(self, target: str, study: str | None = None) -> Path:
        """``<run_dir>/live/<target>``, or ``<log_dir>/<study>/<run_id>`` for a shared TensorBoard dir."""
        log_dir = self.live.tensorboard.log_dir
        if target == "tensorboard" and log_dir is not None:
            return Path(log_dir) / str(study or "default") / self.run_dir.name
        return self.run_dir / LIVE_DIR / target

    def _check(self, target: str, out: Path) -> None:
        """A shared ``log_dir`` may hold other runs' logs: replace only this run's own."""
        if target == "tensorboard" and self.live.tensorboard.log_dir is not None:
            _check_log_dir(out, self.run_dir)

    def _events_dir(self, out: Path) -> Path:
        return out if self.live.tensorboard.log_dir is not None else out / self.run_dir.name

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
        self.study = config.get("study")
        recipe = (config.get("model") or {}).get("recipe", "unknown")
        lr = (config.get("optim") or {}).get("lr")
        cohort = recipe if lr is None else f"{recipe} lr={lr:g}"
        for target in self.targets:
            out = self.out(target, self.study)
            self._check(target, out)
            if out.exists():
                shutil.rmtree(out)  # each invocation streams the whole history afresh
            out.mkdir(parents=True)
            atomic_write_json(out / MARKER, {"run_dir": str(self.run_dir.resolve())})
            if target == "tensorboard":
                self.sinks[target] = TensorBoardSink(out, self._events_dir(out))
            else:
                self.sinks[target] = WandbSink(out, run_id, self.study, cohort, self.live.wandb)

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
        """The trainer's callback: stream new rows; a failing log never stops training.
        Per-step ``"step"`` events write no rows and are ignored (no file read per step)."""
        if self.error is not None or event == "step":
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
            out = self.out(target, self.study)
            paths, extra = sink.close(run)
            if run is None:
                continue
            write_record(
                out,
                target,
                self.run_dir,
                [run],
                fingerprint(target, [run]),
                [*paths, MARKER, VERIFY_FILE],
                extra,
            )
            report = VerifyReport(target=f"live {target}", out=out)
            if self.error is not None:
                report.mismatch(self.error)
            if target == "tensorboard":
                tensorboard_export.verify([run], out, report, events_dir=sink.events_dir)
            else:
                wandb_export.verify([run], out, {"wandb_files": extra["wandb_files"]}, report)
            atomic_write_json(out / VERIFY_FILE, report.to_dict())
            reports.append(report)
        self.sinks = {}
        return reports
