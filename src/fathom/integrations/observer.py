"""The epoch-end observer the training-loop callbacks share: Fathom's instruments, Fathom's logs.

:class:`EpochObserver` measures a model at epoch boundaries with
:class:`fathom.telemetry.instruments.Instruments` (read-only: the probe runs in dense
evaluation mode, no ``.grad`` is touched, RNG states are restored, so the training it observes
is unchanged) and writes each observation as one history row through Fathom's live export
targets (:data:`fathom.config.export.EXPORT_TARGETS` with ``live``: TensorBoard, W&B), exactly
as ``fathom train --live`` streams a run: the same event files and W&B records, units,
descriptions and HParams. The callbacks (:mod:`fathom.integrations.lightning`,
:mod:`fathom.integrations.huggingface`) only say when an epoch ends and what the loop logged.

A row: ``epoch`` (0 before the first step, ``e`` after ``e`` epochs), ``clock/unix_s`` (the
row's Unix time), ``clock/elapsed_s`` (wall seconds since training started, the observations
included), ``clock/telemetry_s`` (the instruments' own seconds, summed), the loop's logged
numbers under their own names, and the instrument fields (:mod:`fathom.telemetry.registry`).

Layout, one directory per target under ``out`` (as a run's ``live/<target>``)::

    <out>/tensorboard/<name>/events.out.tfevents.*     tensorboard --logdir <out>/tensorboard
    <out>/wandb/wandb/offline-run-*/                   wandb sync <that dir>

:meth:`EpochObserver.close` finishes every log, reads it back with the target's own reader
against the rows it wrote (:class:`fathom.export.common.VerifyReport`, also saved as
``verify.json``) and returns the reports; :attr:`EpochObserver.rows` keeps the rows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fathom.base.io import atomic_write_json, config_digest, json_safe
from fathom.config.export import live_targets
from fathom.config.live import LiveConfig, live_config
from fathom.errors import FathomError
from fathom.export.backend import LiveRun, LiveSink, backend, check_target
from fathom.export.common import VerifyReport, export_scalars
from fathom.report.runs import RunData

_VERIFY_FILE = "verify.json"


def numbers(metrics: Mapping[str, Any]) -> dict[str, float | int | bool]:
    """The entries of a loop's logged metrics that are one number (a one-element tensor
    included); the others (text, vectors) are left out."""
    out: dict[str, float | int | bool] = {}
    for k, v in metrics.items():
        if hasattr(v, "numel") and hasattr(v, "item"):
            if v.numel() != 1:
                continue
            v = v.detach().item() if hasattr(v, "detach") else v.item()
        if isinstance(v, bool | int | float):
            out[str(k)] = v
    return out


class EpochObserver:
    """Observe a model at epoch ends and log each row through Fathom's live export targets.

    ``out``: the directory of the logs; ``probe``: ``(x, y)`` the examples the instruments
    measure on (moved to the model's device); ``targets``: live targets (default TensorBoard);
    ``families``: instrument families (``"all"``, or e.g. ``("probe", "params")``);
    ``name``: the run's name (TensorBoard directory, W&B run id and name); ``project``: W&B's
    project (default ``"fathom"``); ``group``: W&B's group, the runs to compare (default:
    the name); ``live``: the ``[live]`` settings (W&B mode, entity, project).
    """

    def __init__(
        self,
        out: str | Path,
        probe: tuple[Any, Any],
        *,
        targets: Sequence[str] = ("tensorboard",),
        families: str | Iterable[str] = "all",
        name: str = "run",
        project: str | None = None,
        group: str | None = None,
        live: LiveConfig | None = None,
    ) -> None:
        for t in targets:
            check_target(t, live=True)
        if not targets:
            raise FathomError(f"no export target given; name one or more of {live_targets()}")
        if not isinstance(probe, tuple | list) or len(probe) != 2:
            raise FathomError("probe must be a pair (x, y): inputs and integer labels")
        self.out, self.probe, self.families = Path(out), tuple(probe), families
        self.name, self.project, self.group = name, project, group or name
        self.live = live_config(live if live is not None else tuple(targets)).with_backends(
            tuple(targets)
        )
        self.backends = {t: backend(t) for t in targets}
        for b in self.backends.values():
            b.require()  # a missing package is said before training starts
        self.sinks: dict[str, LiveSink] = {}
        self.rows: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {}
        self.instruments: Any = None
        self.t0 = 0.0
        self.telemetry_s = 0.0

    # -- the loop's events -------------------------------------------------------------------
    def start(self, model: Any, config: Mapping[str, Any]) -> None:
        """Training starts: the instruments take the model's parameters as the reference of
        displacement and every log is opened (a directory already holding one is refused);
        the callbacks then observe the epoch-0 row."""
        from fathom.telemetry.instruments import Instruments

        self.t0 = time.perf_counter()
        self.config = json_safe(dict(config))
        device = next((p.device for p in model.parameters()), None)
        x, y = (t.to(device) if device is not None else t for t in self.probe)
        self.instruments = Instruments(model, x, y, self.families)
        live = LiveRun(self.out / self.name, self.project, self.group)
        for target, b in self.backends.items():
            where = self.out / target
            if where.exists() and any(where.iterdir()):
                raise FathomError(
                    f"{str(where)!r} already holds a log; give the callback a new directory "
                    "(out=...) or remove that one"
                )
            where.mkdir(parents=True, exist_ok=True)
            self.sinks[target] = b.live_sink(where, self.live, live)

    def measure(self, epoch: int, optimizer: Any = None) -> dict[str, Any]:
        """The instruments' fields after ``epoch`` epochs and the clocks, now (not yet written)."""
        if self.instruments is None:
            raise FathomError("observe() before start(): the callback's training has not started")
        if self.rows and epoch <= self.rows[-1]["epoch"]:
            raise FathomError(
                f"epoch {epoch} observed after epoch {self.rows[-1]['epoch']}; epochs must increase"
            )
        t = time.perf_counter()
        fields = self.instruments.observe(optimizer)
        self.telemetry_s += time.perf_counter() - t
        return {
            "epoch": int(epoch),
            **fields,
            "clock/telemetry_s": self.telemetry_s,
            "clock/elapsed_s": time.perf_counter() - self.t0,
            "clock/unix_s": time.time(),
        }

    def record(self, measured: dict[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Write one row: the loop's one-number ``metrics`` beside what was ``measured``."""
        logged = {k: v for k, v in numbers(metrics).items() if k not in measured}
        row = {"epoch": measured["epoch"], **logged, **measured}
        values, _ = export_scalars(row)
        for sink in self.sinks.values():
            sink.write(row, values)
        self.rows.append(row)
        return row

    def observe(
        self, epoch: int, optimizer: Any = None, metrics: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """One row after ``epoch`` epochs: the loop's ``metrics`` and the instruments' fields."""
        return self.record(self.measure(epoch, optimizer), metrics or {})

    def close(self, status: str = "complete") -> list[VerifyReport]:
        """Finish every log, verify it against the rows written (module docstring)."""
        run = self.run_data(status)
        reports = []
        for target, sink in self.sinks.items():
            _paths, extra = sink.close(run)
            report = VerifyReport(target=f"callback {target}", out=self.out / target)
            sink.verify(run, self.out / target, extra, report)
            atomic_write_json(self.out / target / _VERIFY_FILE, report.to_dict())
            reports.append(report)
        self.sinks = {}
        if self.instruments is not None:
            self.instruments.close()
        return reports

    def run_data(self, status: str) -> RunData:
        """The observed run as exports read runs: config, status, clocks, rows."""
        last = self.rows[-1] if self.rows else {}
        final = last.get("epoch")
        manifest = {
            "run_id": self.name,
            "study": self.project,
            "status": status,
            "config": self.config,
            "config_hash": config_digest(self.config),
            "epochs_completed": final or 0,
            "final": {"epoch": final},
            "selected": {},
            "clocks": {
                k.removeprefix("clock/"): v
                for k, v in last.items()
                if k.startswith("clock/") and isinstance(v, float) and math.isfinite(v)
            },
        }
        return _ObservedRun(self.out, self.name, manifest, list(self.rows), group=self.group)


@dataclass
class _ObservedRun(RunData):
    """A run observed by a callback: no run directory, its group named by the user."""

    group: str = ""

    @property
    def cohort(self) -> str:
        return self.group
