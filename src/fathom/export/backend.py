"""What an export backend is: a :class:`typing.Protocol`, and the one way to get one by name.

The table of backends is :data:`fathom.config.export.EXPORT_TARGETS` (name -> module and
capabilities). A backend is a module whose functions implement the Protocols:

* every backend is an :class:`ExportBackend`: ``write`` an export of runs into ``out``
  (the paths it wrote, relative to ``out``, and extra fields for the export record; the
  export options its table entry lists arrive as keywords, e.g. ``checkpoints``), and
  ``read_back`` an export (``record``: its export record) with the target's own reader;
* a backend whose entry has ``live`` is also a :class:`LiveBackend`: ``require`` refuses a
  missing package before training starts, ``live_out`` places a run's live log,
  ``live_sink`` starts a :class:`LiveSink` that :class:`fathom.export.live.LiveTracker`
  feeds one history row at a time and whose result is verified by the same read-back.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fathom.config.export import EXPORT_TARGETS, export_targets, live_targets
from fathom.config.live import LiveConfig
from fathom.errors import FathomError
from fathom.export.common import VerifyReport
from fathom.report.runs import RunData


@runtime_checkable
class ExportBackend(Protocol):
    """Post-hoc export of runs and its read-back."""

    def write(
        self, runs: list[RunData], out: Path, **options: bool
    ) -> tuple[list[str], dict[str, Any]]:
        """Write ``runs`` into ``out``: ``(paths relative to out, extra record fields)``;
        ``options``: those of the table entry's ``options`` that were set."""
        ...

    def read_back(
        self, runs: list[RunData], out: Path, record: dict[str, Any], report: VerifyReport
    ) -> None:
        """Read the export in ``out`` back and note every difference from ``runs`` in ``report``."""
        ...


@dataclass(frozen=True)
class LiveRun:
    """Who a live log belongs to: the run directory, its study and cohort (group)."""

    run_dir: Path
    study: str | None
    cohort: str


@runtime_checkable
class LiveSink(Protocol):
    """One run's live log, written one history row at a time."""

    def write(self, row: dict[str, Any], values: dict[str, Any]) -> None:
        """One row as recorded and as flattened scalars in export units."""
        ...

    def close(self, run: RunData | None) -> tuple[list[str], dict[str, Any]]:
        """Finish the log (``run``: the finished run, when its manifest exists): as ``write``."""
        ...

    def verify(self, run: RunData, out: Path, extra: dict[str, Any], report: VerifyReport) -> None:
        """The export's read-back of this log against ``run``."""
        ...


@runtime_checkable
class LiveBackend(ExportBackend, Protocol):
    """A backend that also streams a run's rows while it trains."""

    def require(self) -> None:
        """Refuse (``FathomError`` with the install hint) when the backend's package is missing."""
        ...

    def live_out(self, live: LiveConfig, run: LiveRun) -> Path | None:
        """Where the run's live log goes when ``live`` places it outside ``run_dir/live/<name>``
        (then it may be shared with other runs' logs), else ``None``."""
        ...

    def live_sink(self, out: Path, live: LiveConfig, run: LiveRun) -> LiveSink:
        """Start the live log in the (fresh, empty but for the marker) directory ``out``."""
        ...


def check_target(target: str, *, live: bool = False) -> None:
    """Refuse a name that is not in the table (or not a live backend), listing the choices."""
    names = live_targets() if live else export_targets()
    if target not in names:
        what = "live target" if live else "export target"
        raise FathomError(f"unknown {what} {target!r}; use one of: {', '.join(names)}")


def backend(target: str) -> Any:
    """``target``'s backend module (:data:`EXPORT_TARGETS`), imported now and checked
    against its Protocol (every function present)."""
    check_target(target)
    module = importlib.import_module(EXPORT_TARGETS[target].module)
    want = LiveBackend if EXPORT_TARGETS[target].live else ExportBackend
    if not isinstance(module, want):
        raise FathomError(
            f"export target {target!r}: module {module.__name__} is not a {want.__name__} "
            "(see fathom.export.backend for the functions it must define)"
        )
    return module
