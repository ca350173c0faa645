"""What every export shares: the values to write, the export record, the target guard, the report.

Values. A history row is flattened to scalars for W&B and TensorBoard: a numeric or
boolean field (``diverged``) keeps its name; a matrix field (``split/val/confusion``)
becomes one scalar per entry, ``split/val/confusion/<row>/<col>``; anything else (a
string) is left out and named in the report. JSONL keeps every field as recorded.

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
from pathlib import Path
from typing import Any

from fathom.errors import FathomError
from fathom.io import atomic_write_json, config_digest
from fathom.report.runs import RunData

RECORD = "fathom-export.json"
FORMAT = 1


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


def same_value(expected: Any, got: Any) -> bool:
    """Exact equality where NaN equals NaN and a bool equals only a bool (float64 targets)."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, float) and isinstance(got, float) and math.isnan(expected):
        return math.isnan(got)
    return expected == got


def fingerprint(target: str, runs: list[RunData]) -> str:
    return config_digest(
        {
            "target": target,
            "runs": [[r.run_id, r.history_sha256, r.manifest.get("config_hash")] for r in runs],
        }
    )


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
        out = [head]
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
        }


def read_record(out: Path) -> dict[str, Any] | None:
    path = out / RECORD
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
        if out.exists() and any(out.iterdir()):
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
    (out / RECORD).unlink()


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
        out / RECORD,
        {
            "format": FORMAT,
            "target": target,
            "source": str(root.resolve()),
            "fingerprint": fp,
            "paths": paths,
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
