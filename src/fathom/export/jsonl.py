"""JSONL export: one line per run-epoch, every history field plus the run's metadata.

Each line is strict JSON: the row's fields as recorded except accuracy, which is in percent
under ``<name>_pct`` (:func:`fathom.export.common.in_export_units`), and the run metadata under keys
``run/<name>`` (``run/run_id``, ``run/study``, ``run/status``, ``run/recipe``, ``run/lr``,
``run/seed``, ``run/cohort``, ``run/config_hash``, ``run/source_hash``,
``run/history_sha256``, ``run/flagged_lines``). JSON has no NaN or infinity, so a
non-finite float is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``
(W&B's spelling); null stays null. Lines are ordered by run, then epoch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fathom.base.io import atomic_write_text
from fathom.errors import FathomError
from fathom.export.common import VerifyReport, in_export_units, same_value
from fathom.report.runs import RunData, nonfinite_name

_FILE = "history.jsonl"


def _encode(value: Any) -> Any:
    """Non-finite floats as strings, recursively (matrices included)."""
    if isinstance(value, float):
        return nonfinite_name(value) or value
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _lines_for(run: RunData) -> list[dict[str, Any]]:
    meta = {f"run/{k}": v for k, v in run.metadata().items()}
    out = []
    for row in run.rows:
        clash = sorted(set(row) & set(meta))
        if clash:
            raise FathomError(
                f"run {run.run_id!r}: history fields {clash} collide with the JSONL metadata keys; "
                "rename them in the history (the prefix run/ is reserved for exports)"
            )
        out.append({**meta, **_encode(in_export_units(row))})
    return out


def write(runs: list[RunData], out: Path) -> tuple[list[str], dict[str, Any]]:
    text = "".join(
        json.dumps(line, allow_nan=False) + "\n" for run in runs for line in _lines_for(run)
    )
    atomic_write_text(out / _FILE, text)
    return [_FILE], {}


def read_back(runs: list[RunData], out: Path, record: dict[str, Any], report: VerifyReport) -> None:
    """:class:`fathom.export.backend.ExportBackend`'s read-back: :func:`verify`."""
    verify(runs, out, report)


def verify(runs: list[RunData], out: Path, report: VerifyReport) -> None:
    path = out / _FILE
    if not path.exists():
        report.mismatch(f"{path} is missing")
        return
    got: dict[str, list[dict[str, Any]]] = {}
    for n, text in enumerate(path.read_text().splitlines(), start=1):
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            report.mismatch(f"{_FILE} line {n} does not parse")
            continue
        got.setdefault(str(line.get("run/run_id")), []).append(line)
    extra = sorted(set(got) - {r.run_id for r in runs})
    if extra:
        report.mismatch(f"{_FILE} holds runs not in the source: {extra}")
    for run in runs:
        expected = _lines_for(run)
        lines = got.get(run.run_id, [])
        report.runs += 1
        if len(lines) != len(expected):
            report.mismatch(f"run {run.run_id}: {len(lines)} lines, expected {len(expected)}")
        for exp, line in zip(expected, lines):
            report.rows += 1
            report.steps += 1
            if set(exp) != set(line):
                report.mismatch(
                    f"run {run.run_id} epoch {exp['epoch']}: keys differ {sorted(set(exp) ^ set(line))[:5]}"
                )
            for k, v in exp.items():
                report.values += 1
                if not same_value(v, line.get(k)):
                    report.mismatch(
                        f"run {run.run_id} epoch {exp['epoch']} {k}: wrote {v!r}, read {line.get(k)!r}"
                    )
