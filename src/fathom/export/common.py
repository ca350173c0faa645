"""What every export shares: the values to write, the export record, the target guard, the report.

Units. ``history.jsonl`` keeps accuracy as a fraction in [0, 1] (the run directory's raw
contract); every export writes accuracy in percent, the unit every Fathom rendering uses,
through the one conversion :func:`fathom.base.units.percent` (``100 f``), and states the
unit in the name: an accuracy field (:data:`ACCURACY_PATTERNS`, registry patterns) is
exported as its name with ``_pct`` appended to the accuracy segment (``val/acc`` ->
``val/acc_pct``, ``split/val/class_acc/3`` -> ``split/val/class_acc_pct/3``), so an
exported value can never be read as the history's fraction under the same key. The suffix
keeps tags in TensorBoard's ``[A-Za-z0-9_./-]`` charset and W&B keys usable in queries
(``%`` or spaces would not be). The export record and the W&B config also carry the
``units`` table (:func:`units_table`); TensorBoard events carry it as each accuracy tag's
description. Read-back verification converts the history through the same function, so an
export holding fractions fails it.

Values. W&B and TensorBoard take a row's numbers: a numeric or boolean field
(``diverged``) keeps its name, a matrix field (``split/val/confusion``) is kept whole (a W&B
table, a TensorBoard tensor and image), anything else (a string) is left out and named in
the report. :func:`flatten_row` is the flat form (a matrix as one scalar per entry,
``split/val/confusion/<row>/<col>``) a live sink also receives. JSONL keeps every field as
recorded. Every export stamps a row's values with the row's own time (:func:`wall_time`).

Export record. ``<out>/fathom-export.json`` names the target, the source directory, the
runs with their history hashes and row counts, the paths the export wrote, and a
fingerprint over (target, run id, history hash, config hash). An ``--out`` that holds a
record with another fingerprint is a different export: refused unless ``--force``, which
deletes the paths that record lists before writing. An ``--out`` that holds other files
and no record is never written into.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from fathom.base.io import atomic_write_json, config_digest
from fathom.base.units import ACCURACY_UNIT, percent
from fathom.errors import FathomError
from fathom.report.runs import RunData, unfinished
from fathom.rundir.output import OUTPUT_LOCK

_RECORD = "fathom-export.json"
FORMAT = 2  # 2: accuracy exported in percent under *_pct names

ACCURACY_PATTERNS: tuple[str, ...] = (
    "{split}/acc",
    "train/acc",
    "probe/acc",
    "split/{split}/class_acc/{cls}",
)
"""The registry patterns (:mod:`fathom.telemetry.registry`) of every accuracy field."""
PERCENT_SUFFIX = "_pct"
WALL_FIELD = "clock/unix_s"


@cache
def accuracy_name(name: str) -> str | None:
    """The exported name of an accuracy field (``val/acc`` -> ``val/acc_pct``), else ``None``."""
    from fathom.telemetry.registry import field_for

    try:
        pattern = field_for(name).pattern
    except FathomError:  # not a declared field (a user's extra key): exported as recorded
        return None
    if pattern not in ACCURACY_PATTERNS:
        return None
    parts = name.split("/")
    at = next(i for i, seg in enumerate(pattern.split("/")) if seg.endswith("acc"))
    parts[at] += PERCENT_SUFFIX
    return "/".join(parts)


def in_export_units(row: Mapping[str, Any]) -> dict[str, Any]:
    """A history row with every accuracy field in percent under its exported name.

    ``percent`` keeps ``None`` (undefined) and NaN as they are; other fields are unchanged.
    """
    out: dict[str, Any] = {}
    for k, v in row.items():
        name = accuracy_name(k)
        if name is None:
            out[k] = v
        else:
            if name in row:
                raise FathomError(
                    f"history field {name!r} collides with the exported name of {k!r}; "
                    "rename it (the suffix _pct is reserved for exported accuracies)"
                )
            out[name] = v if isinstance(v, bool) or not isinstance(v, int | float) else percent(v)
    return out


def units_table(runs: list[RunData]) -> dict[str, str]:
    """``{exported accuracy key: "%"}`` over every row of ``runs`` (what the record states)."""
    keys = {accuracy_name(k) for r in runs for row in r.rows for k in row}
    return {k: ACCURACY_UNIT for k in sorted(k for k in keys if k is not None)}


def export_scalars(row: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The scalars W&B and TensorBoard receive for one row: :func:`flatten_row` in export units."""
    return flatten_row(in_export_units(row))


def flatten_row(row: Mapping[str, Any]) -> tuple[dict[str, float | int | bool | None], list[str]]:
    """``(scalars, skipped field names)`` for one history row; see the module docstring."""
    out: dict[str, float | int | bool | None] = {}
    skipped: list[str] = []
    for k, v in row.items():
        if v is None or isinstance(v, int | float):
            out[k] = v
        elif isinstance(v, list) and all(isinstance(r, list) for r in v) and v:
            for i, r in enumerate(v):
                for j, x in enumerate(r):
                    if x is None or (isinstance(x, int | float) and not isinstance(x, bool)):
                        out[f"{k}/{i}/{j}"] = x
        else:
            skipped.append(k)
    return out, skipped


def wall_time(row: Mapping[str, Any], last: float) -> tuple[float, bool]:
    """``(wall time, is a real timestamp)`` for a row: its own Unix timestamp ``clock/unix_s``,
    else ``clock/elapsed_s`` (a history older than that field), else ``last``: the time every
    export stamps the row's values with (TensorBoard's ``wall_time``, W&B's ``_timestamp``)."""
    for key, real in ((WALL_FIELD, True), ("clock/elapsed_s", False)):
        v = row.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            return float(v), real
    return last, False


def is_matrix(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(r, list) for r in value)


def same_value(expected: Any, got: Any) -> bool:
    """Exact equality where NaN equals NaN and a bool equals only a bool (float64 targets)."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, float) and isinstance(got, float) and math.isnan(expected):
        return math.isnan(got)
    return expected == got


def fingerprint(target: str, runs: list[RunData], extra: Mapping[str, Any] | None = None) -> str:
    """The digest of what an export is made from: target, each run's id, history hash and
    config hash, and ``extra`` when given (options, analysis files' hashes)."""
    made_of: dict[str, Any] = {
        "target": target,
        "runs": [[r.run_id, r.history_sha256, r.recorded.config_hash] for r in runs],
    }
    if extra:
        made_of["extra"] = dict(extra)
    return config_digest(made_of)


@dataclass
class VerifyReport:
    """What a read-back found: counts of what matched, and every mismatch."""

    target: str
    out: Path
    runs: int = 0
    rows: int = 0
    values: int = 0
    steps: int = 0
    mismatches: list[str] = field(default_factory=list)
    flagged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # runs running or interrupted

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def mismatch(self, text: str) -> None:
        self.mismatches.append(text)

    def lines(self) -> list[str]:
        head = (
            f"{self.target} export at {self.out}: {'verified' if self.ok else 'MISMATCH'} by reading back "
            f"{self.runs} runs, {self.rows} history rows, {self.values} values, {self.steps} steps"
        )
        if self.unfinished:  # the line that says "verified" says it is a snapshot too
            head += f"; a snapshot: {len(self.unfinished)} runs not finished"
        out = [head]
        out += [f"not finished: {x}" for x in self.unfinished]  # a snapshot, said so
        out += [f"flagged: {x}" for x in self.flagged]
        out += [f"note: {x}" for x in self.notes]
        shown = self.mismatches[:50]
        out += [f"mismatch: {x}" for x in shown]
        if len(self.mismatches) > len(shown):
            out.append(f"... and {len(self.mismatches) - len(shown)} more mismatches")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "ok": self.ok,
            "runs": self.runs,
            "rows": self.rows,
            "values": self.values,
            "steps": self.steps,
            "mismatches": self.mismatches,
            "flagged": self.flagged,
            "notes": self.notes,
            "unfinished": self.unfinished,
        }


def read_record(out: Path) -> dict[str, Any] | None:
    path = out / _RECORD
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise FathomError(
            f"{str(path)!r} is corrupt ({e}); delete the export directory and export again"
        ) from None


def prepare_target(out: Path, target: str, fp: str, force: bool) -> None:
    """Refuse a different export (unless ``force``) or foreign files; clear a previous export."""
    record = read_record(out)
    if record is None:
        if out.exists() and any(p.name != OUTPUT_LOCK for p in out.iterdir()):
            raise FathomError(
                f"{str(out)!r} holds files that are not a Fathom export; choose an empty or new --out "
                "(--force only replaces a previous Fathom export)"
            )
        return
    if record.get("fingerprint") != fp and not force:
        raise FathomError(
            f"{str(out)!r} already holds a different export ({record.get('target')} of "
            f"{len(record.get('runs', {}))} runs from {record.get('source')}); pass --force to replace it "
            "or choose another --out"
        )
    for rel in record.get("paths", []):
        p = out / rel
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    (out / _RECORD).unlink()


def write_record(
    out: Path,
    target: str,
    root: Path,
    runs: list[RunData],
    fp: str,
    paths: list[str],
    extra: Mapping[str, Any],
) -> None:
    atomic_write_json(
        out / _RECORD,
        {
            "format": FORMAT,
            "target": target,
            "source": str(root.resolve()),
            "fingerprint": fp,
            "paths": paths,
            "unfinished": unfinished(runs),  # runs still training or interrupted: a snapshot
            "units": {
                "accuracy": "percent: 100 x the fraction in history.jsonl "
                "(fathom.base.units.percent), under the name + '_pct'",
                "keys": units_table(runs),
            },
            "runs": {
                r.run_id: {
                    **r.metadata(),
                    "rows": len(r.rows),
                    "epochs": [row["epoch"] for row in r.rows],
                }
                for r in runs
            },
            **extra,
        },
    )
