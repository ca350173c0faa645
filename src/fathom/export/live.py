"""Live tracking: stream a run's history rows to the live backends while it trains.

An observer of the trainer's row events (the ``progress(event, info)`` callback of
:func:`fathom.train.loop.train`). It never reads the trainer's memory: on every event it
reads the lines appended to ``history.jsonl`` since the last event and writes exactly those
rows, so the live logs hold the same rows as the run directory (the divergence row
included, read when the tracker closes). It runs between epochs, outside the training
clock (which times optimizer steps only) and after the row is on disk; it only reads the
run directory, so parameters, optimizer state and the training RNG are untouched.

The backends are the table's entries with ``live`` (:data:`fathom.config.export.EXPORT_TARGETS`:
TensorBoard and W&B), each a :class:`fathom.export.backend.LiveBackend`; the tracker knows
none by name. Layout, one per run and target (the export formats,
:mod:`fathom.export.tensorboard_export` and :mod:`fathom.export.wandb_export`)::

    <run_dir>/live/tensorboard/<run_id>/events.out.tfevents.*   tensorboard --logdir <study dir>
    <log_dir>/<study>/<run_id>/events.out.tfevents.*            with [live.tensorboard] log_dir
    <run_dir>/live/wandb/wandb/offline-run-*/                    wandb sync <that dir>
    <each of those>/fathom-live.json, fathom-export.json, verify.json

Settings come from the ``[live]`` config section (:mod:`fathom.config.live`), with the
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

from fathom.base.interrupts import interrupts_unwrapped
from fathom.base.io import atomic_write_json
from fathom.base.terminal import OnProgress
from fathom.config.export import live_targets
from fathom.config.live import LiveConfig, live_config
from fathom.errors import FathomError
from fathom.export.backend import LiveRun, LiveSink, backend
from fathom.export.common import (
    VerifyReport,
    export_scalars,
    fingerprint,
    write_record,
)
from fathom.rundir import RunDir

_LIVE_DIR = "live"
_MARKER = "fathom-live.json"
"""Written first into every live log directory: the run directory it belongs to."""


def parse_live(text: str | None) -> tuple[str, ...]:
    """``"tensorboard,wandb"`` -> ``("tensorboard", "wandb")``; ``None``, ``""``, ``"off"`` -> ``()``."""
    if not text or text.strip() == "off":
        return ()
    targets = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in targets if t not in live_targets()]
    if bad:
        raise FathomError(
            f"unknown live target(s) {bad}; use a comma-separated list of {', '.join(live_targets())}"
        )
    return targets


def _check_log_dir(out: Path, run_dir: Path) -> None:
    """Refuse to replace a directory that is not this run's live log (a shared ``log_dir``)."""
    if not out.exists() or not any(out.iterdir()):
        return
    marker = out / _MARKER
    owner = json.loads(marker.read_text()).get("run_dir") if marker.exists() else None
    if owner != str(run_dir.resolve()):
        what = f"the live log of {owner}" if owner else "files that are not a Fathom live log"
        raise FathomError(
            f"{str(out)!r} holds {what}; each invocation replaces its own live log only: "
            "choose another log_dir in [live] or remove that directory"
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

    ``live``: the run's :class:`~fathom.config.live.LiveConfig` (or a list of backends, with
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
        self.backends = {t: backend(t) for t in self.targets}
        for b in self.backends.values():
            b.require()  # a missing package is reported before training starts
        self.sinks: dict[str, LiveSink] = {}
        self.offset = 0
        self.last_epoch: int | None = None
        self.rows = 0
        self.error: str | None = None
        self.run: LiveRun | None = None
        known = self._config()
        if known is not None:
            for target in self.targets:
                self._check(target, self.out(target, known.get("study")))

    def _run(self, config: dict[str, Any]) -> LiveRun:
        recipe = (config.get("model") or {}).get("recipe", "unknown")
        lr = (config.get("optim") or {}).get("lr")
        cohort = recipe if lr is None else f"{recipe} lr={lr:g}"
        return LiveRun(self.run_dir, config.get("study"), cohort)

    def out(self, target: str, study: str | None = None) -> Path:
        """``<run_dir>/live/<target>``, or where the backend places it (a shared directory:
        ``<log_dir>/<study>/<run_id>`` for TensorBoard with ``[live.tensorboard] log_dir``)."""
        placed = self.backends[target].live_out(self.live, LiveRun(self.run_dir, study, ""))
        return self.run_dir / _LIVE_DIR / target if placed is None else placed

    def _check(self, target: str, out: Path) -> None:
        """A directory outside the run's own may hold other runs' logs: replace only this run's."""
        if out != self.run_dir / _LIVE_DIR / target:
            _check_log_dir(out, self.run_dir)

    def _config(self) -> dict[str, Any] | None:
        """The run's config: from the manifest once written (as recorded, read by the one
        reader), else the one given."""
        if (self.run_dir / "manifest.json").exists():
            return RunDir(self.run_dir).recorded.config.as_json()
        if self.config is None:
            return None
        return self.config if isinstance(self.config, dict) else self.config.model_dump(mode="json")

    def _open(self, config: dict[str, Any]) -> None:
        self.run = run = self._run(config)  # run id = the directory name (manifest "run_id")
        for target in self.targets:
            out = self.out(target, run.study)
            self._check(target, out)
            if out.exists():
                shutil.rmtree(out)  # each invocation streams the whole history afresh
            out.mkdir(parents=True)
            atomic_write_json(out / _MARKER, {"run_dir": str(self.run_dir.resolve())})
            self.sinks[target] = self.backends[target].live_sink(out, self.live, run)

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
            with interrupts_unwrapped():  # Ctrl-C inside a serializer stops training like Ctrl-C
                self.poll()
        except Exception as e:  # the logs are secondary: report at close, keep training
            self.error = (
                f"live tracking stopped at epoch {self.last_epoch}: {type(e).__name__}: {e}"
            )

    def close(self) -> list[VerifyReport]:
        """Stream what is left, finish every log, write its record and verify it by reading back."""
        from fathom.export.run import VERIFY_FILE
        from fathom.report.runs import load_runs

        if self.error is None:
            self.poll()
        run = load_runs(self.run_dir)[0] if (self.run_dir / "manifest.json").exists() else None
        reports = []
        for target, sink in self.sinks.items():
            out = self.out(target, self.run.study if self.run else None)
            paths, extra = sink.close(run)
            if run is None:
                continue
            write_record(
                out,
                target,
                self.run_dir,
                [run],
                fingerprint(target, [run]),
                [*paths, _MARKER, VERIFY_FILE],
                extra,
            )
            report = VerifyReport(target=f"live {target}", out=out)
            if self.error is not None:
                report.mismatch(self.error)
            sink.verify(run, out, extra, report)
            atomic_write_json(out / VERIFY_FILE, report.to_dict())
            reports.append(report)
        self.sinks = {}
        return reports
