"""Read a W&B export back from its ``.wandb`` files (:mod:`fathom.export.wandb_records`).

Per run, against what :mod:`fathom.export.wandb_export` writes from the run directory:

* the run record: group (cohort), job type and tags; the config record: every top-level key
  (the run's config sections, ``trained``, ``fathom``) equal after a JSON round trip;
* every history record: the step sequence equals the epochs; every scalar's ``value_json``
  float64-exact (NaN and infinities included), the analyses' scalars of that epoch included
  (an export; a live log has none); ``_timestamp`` equal to the row's own time;
  every matrix's table file (under the run's ``files/``) holding exactly its entries;
* the last summary value of each ``fathom/`` key;
* with ``--checkpoints``: one ``model`` artifact version per checkpoint, holding the file under
  its name with W&B's digest (base64 MD5) and size of the file in the run directory, whose
  SHA-256 still equals the manifest's, with its aliases.

W&B's own ``_runtime`` measures the exporter and is ignored.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from pathlib import Path
from typing import Any

from fathom.base.io import json_safe, sha256_file
from fathom.export.common import VerifyReport, same_value, wall_time
from fathom.export.describe import job_type, run_tags
from fathom.export.wandb_content import (
    TABLE_SUFFIX,
    analyses_by_epoch,
    columns,
    row_values,
    run_config,
    run_summary,
    table_rows,
    wandb_module,
)
from fathom.export.wandb_records import WandbRun, is_complete, read_records
from fathom.report.runs import RunData


def _md5_b64(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return base64.b64encode(h.digest()).decode()


def _same_cells(want: list[list[Any]], got: Any) -> bool:
    if not isinstance(got, list) or len(got) != len(want):
        return False
    return all(
        isinstance(g, list) and len(g) == len(w) and all(same_value(a, b) for a, b in zip(w, g))
        for w, g in zip(want, got)
    )


def _check_run_record(run: RunData, got: WandbRun, report: VerifyReport, job: str | None) -> None:
    r = got.run
    want = {
        "group": run.cohort,
        "job type": job or job_type(run),
        "tags": run_tags(run),
    }
    read = {
        "group": r.run_group if r else None,
        "job type": r.job_type if r else None,
        "tags": list(r.tags) if r else None,
    }
    for what, v in want.items():
        if read[what] != v:
            report.mismatch(f"run {run.run_id}: {what} wrote {v!r}, read {read[what]!r}")
    for k, v in json.loads(json.dumps(run_config(run))).items():
        if got.config.get(k) != v:
            report.mismatch(f"run {run.run_id}: config {k!r} differs from the manifest")
    for k, v in json_safe(run_summary(run)).items():
        report.values += 1
        if not same_value(v, got.summary.get(k)):
            report.mismatch(
                f"run {run.run_id}: summary {k} wrote {v!r}, read {got.summary.get(k)!r}"
            )


def _check_table(
    run: RunData, name: str, m: Any, item: Any, files: Path, report: VerifyReport
) -> None:
    where = f"run {run.run_id} {name}"
    path = files / item["path"] if isinstance(item, dict) and "path" in item else None
    if path is None or not path.is_file():
        report.mismatch(f"{where}: no table file")
        return
    table = json.loads(path.read_text())
    if table.get("columns") != list(columns(name)) or not _same_cells(
        table_rows(m), table.get("data")
    ):
        report.mismatch(f"{where}: the table differs from the matrix")


def _check_history(
    run: RunData, got: WandbRun, files: Path, report: VerifyReport, analyses: bool
) -> None:
    steps = [s for s, _ in got.history]
    epochs = [int(row["epoch"]) for row in run.rows]
    report.steps += len(steps)
    if steps != epochs:
        report.mismatch(f"run {run.run_id}: step sequence {steps} != epochs {epochs}")
    wall, more = 0.0, {}
    if analyses:
        more, notes = analyses_by_epoch(run)
        report.notes += notes
    for row, (_, items) in zip(run.rows, got.history):
        report.rows += 1
        wall, _ = wall_time(row, wall)
        where = f"run {run.run_id} epoch {row['epoch']}"
        if not same_value(wall, items.get("_timestamp")):
            report.mismatch(
                f"{where}: _timestamp {items.get('_timestamp')!r} is not the row's time {wall!r}"
            )
        scalars, matrices = row_values(row)
        scalars = {**scalars, **more.get(int(row["epoch"]), {})}
        tables = {name + TABLE_SUFFIX: name for name in matrices}
        got_keys = {k for k in items if not k.startswith("_")}
        if got_keys != set(scalars) | set(tables):
            report.mismatch(
                f"{where}: keys differ {sorted(got_keys ^ (set(scalars) | set(tables)))[:5]}"
            )
        for k, v in scalars.items():
            report.values += 1
            if not same_value(v, items.get(k)) and not (v is None and items.get(k) is None):
                report.mismatch(f"{where} {k}: wrote {v!r}, read {items.get(k)!r}")
        for key, name in tables.items():
            report.values += 1
            _check_table(run, name, matrices[name], items.get(key), files, report)


def _check_artifacts(
    run: RunData, got: WandbRun, logged: list[dict[str, Any]], report: VerifyReport
) -> None:
    by_epoch = {json.loads(a.metadata or "{}").get("epoch"): a for a in got.artifacts}
    if sorted(k for k in by_epoch if k is not None) != [c["epoch"] for c in logged]:
        report.mismatch(
            f"run {run.run_id}: checkpoint artifacts {sorted(by_epoch, key=str)} != {[c['epoch'] for c in logged]}"
        )
        return
    for c in logged:
        art, path = by_epoch[c["epoch"]], run.path / c["file"]
        report.values += 1
        where = f"run {run.run_id} checkpoint epoch {c['epoch']}"
        contents = list(art.manifest.contents)
        if not path.is_file() or sha256_file(path) != c["sha256"]:
            report.mismatch(f"{where}: {c['file']} no longer matches its SHA-256")
        elif (
            len(contents) != 1
            or contents[0].path != path.name
            or contents[0].digest != _md5_b64(path)
            or contents[0].size != path.stat().st_size
        ):
            report.mismatch(
                f"{where}: the artifact does not hold {c['file']} (name, digest or size)"
            )
        if not set(c["aliases"]) <= set(art.aliases):
            report.mismatch(f"{where}: aliases {list(art.aliases)} lack {c['aliases']}")


def verify(
    runs: list[RunData],
    out: Path,
    record: dict[str, Any],
    report: VerifyReport,
    *,
    job: str | None = None,
    analyses: bool = True,
) -> None:
    """Read every run's ``.wandb`` file back (module docstring); ``job``: the job type a live
    log was started with (it is set before the run's phase is known); ``analyses``: the log
    holds the run's analyses (an export; a live log streams the history alone)."""
    wandb_module()
    files = record.get("wandb_files") or {}
    artifacts = record.get("wandb_artifacts")
    for run in runs:
        report.runs += 1
        rel = files.get(run.run_id)
        if rel is None or not (out / rel).exists():
            report.mismatch(f"run {run.run_id}: no .wandb file ({rel})")
            continue
        records = read_records(out / rel)
        if not is_complete(records):
            report.mismatch(
                f"run {run.run_id}: {rel} has no exit record (W&B did not finish writing it); "
                "export again"
            )
            continue
        got = WandbRun(records)
        _check_run_record(run, got, report, job)
        _check_history(run, got, (out / rel).parent / "files", report, analyses)
        if artifacts is not None:
            _check_artifacts(run, got, artifacts.get(run.run_id, []), report)
        nonfinite = sum(
            1
            for row in run.rows
            for v in row_values(row)[0].values()
            if isinstance(v, float) and not math.isfinite(v)
        )
        if nonfinite:
            report.notes.append(
                f"run {run.run_id}: {nonfinite} non-finite values written and read back as NaN/Infinity"
            )
