"""A whole export backend in one module, for ``test_export_backends``: each run's rows as one
JSON file ``<out>/<run_id>.json`` (post-hoc) or ``<out>/rows.json`` (live), read back exactly.

Registering it is one table entry: ``EXPORT_TARGETS["dummy"] = ExportTarget("export_dummy",
live=True, numbers_only=False)``; nothing else in fathom names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fathom.export.common import VerifyReport, in_export_units
from fathom.report.runs import RunData

LIVE_FILE = "rows.json"


def _text(rows: list[dict[str, Any]]) -> str:
    """The rows in export units as JSON text (NaN and infinities as JSON extensions)."""
    return json.dumps([in_export_units(r) for r in rows])


def _check(run: RunData, path: Path, report: VerifyReport) -> None:
    report.runs += 1
    got = path.read_text() if path.exists() else None
    report.rows += len(run.rows)
    report.steps += len(json.loads(got)) if got else 0
    if got != _text(run.rows):
        report.mismatch(f"run {run.run_id}: {path.name} differs from the history")


class DummySink:
    def __init__(self, out: Path) -> None:
        self.out, self.rows = out, []

    def write(self, row: dict[str, Any], values: dict[str, Any]) -> None:
        self.rows.append(row)
        (self.out / LIVE_FILE).write_text(_text(self.rows))

    def close(self, run: RunData | None) -> tuple[list[str], dict[str, Any]]:
        return [LIVE_FILE], {"dummy_rows": len(self.rows)}

    def verify(self, run: RunData, out: Path, extra: dict[str, Any], report: VerifyReport) -> None:
        _check(run, out / LIVE_FILE, report)


OPENED: list[Path] = []  # the live logs opened (for the test)


def write(runs: list[RunData], out: Path) -> tuple[list[str], dict[str, Any]]:
    for run in runs:
        (out / f"{run.run_id}.json").write_text(_text(run.rows))
    return [f"{run.run_id}.json" for run in runs], {"dummy_runs": len(runs)}


def read_back(runs: list[RunData], out: Path, record: dict[str, Any], report: VerifyReport) -> None:
    for run in runs:
        _check(run, out / f"{run.run_id}.json", report)


def require() -> None:
    return None


def live_out(live: Any, run: Any) -> Path | None:
    return None


def live_sink(out: Path, live: Any, run: Any) -> DummySink:
    OPENED.append(out)
    return DummySink(out)
