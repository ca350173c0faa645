"""``export`` and ``verify``: write an export of every run under a directory, then read it back.

Runs whose history had truncated or unparsable lines are exported without those lines
and reported as flagged (the line numbers also travel in each run's metadata). After
writing, the export is verified by reading it back with the target's own reader; the
result is also saved as ``<out>/verify.json``. ``verify`` re-checks an existing export
against the run directories as they are now.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fathom.base.io import atomic_write_json
from fathom.config.export import EXPORT_OPTIONS, EXPORT_TARGETS, export_targets
from fathom.errors import FathomError
from fathom.export.backend import backend, check_target
from fathom.export.common import (
    FORMAT,
    VerifyReport,
    fingerprint,
    flatten_row,
    prepare_target,
    read_record,
    write_record,
)
from fathom.report.runs import RunData, load_runs, unfinished
from fathom.rundir.output import analysis_output

TARGETS = export_targets()  # the table's names when this module was imported
VERIFY_FILE = "verify.json"


def _default_out(root: Path, target: str) -> Path:
    return root / "exports" / target


def _flagged(runs: list[RunData]) -> list[str]:
    """Each flagged problem of each run; a left-out history row says it was not exported."""

    def suffix(reason: str) -> str:
        left_out = reason.startswith(("history line", "history row"))
        return " (exported without it)" if left_out else ""

    return [f"{r.run_id}: {reason}{suffix(reason)}" for r in runs for reason in r.flag_reasons]


def _check_options(target: str, options: dict[str, bool]) -> dict[str, bool]:
    """The options set (true) for ``target``; one the target does not take is refused, naming
    the targets that do (:data:`fathom.config.export.EXPORT_OPTIONS`)."""
    chosen = {k: v for k, v in options.items() if v}
    for name in chosen:
        if name not in EXPORT_OPTIONS:
            raise FathomError(
                f"unknown export option {name!r}; use one of: {', '.join(EXPORT_OPTIONS)}"
            )
        if name not in EXPORT_TARGETS[target].options:
            takers = [t for t, row in EXPORT_TARGETS.items() if name in row.options]
            raise FathomError(
                f"--{name} ({EXPORT_OPTIONS[name]}) is an option of {', '.join(takers)}, "
                f"not of {target}; drop it or export --to {takers[0]}"
            )
    return chosen


def _made_of(target: str, runs: list[RunData], options: dict[str, bool]) -> dict[str, Any]:
    """What the fingerprint covers beside the histories: the options, and for a target that
    exports analyses the hash of every analysis file it reads."""
    extra: dict[str, Any] = dict(options)
    if EXPORT_TARGETS[target].analyses:
        from fathom.export.analyses import run_analyses

        sources = {k: v for r in runs for k, v in run_analyses(r).sources.items()}
        if sources:
            extra["analyses"] = sorted(sources.values())
    return extra


def export(
    root: str | Path,
    target: str,
    out: str | Path | None = None,
    *,
    force: bool = False,
    checkpoints: bool = False,
) -> VerifyReport:
    """Export every run under ``root`` to ``target`` in ``out``, then verify it. The export is
    written under the lock of ``root`` (or of ``out`` elsewhere,
    :func:`fathom.rundir.output.analysis_output`): refused, naming the holder's PID, while a
    trainer, a study or another analysis writes there. ``checkpoints``: also each run's saved
    checkpoints (W&B artifacts)."""
    check_target(target)
    options = _check_options(target, {"checkpoints": checkpoints})
    root = Path(root)
    runs = load_runs(root)
    fp = fingerprint(target, runs, _made_of(target, runs, options))
    default = _default_out(root, target).relative_to(root)
    with analysis_output(root, str(default), out) as output:
        return _write_export(runs, root, target, output.dir, fp, force, options)


def _write_export(
    runs: list[RunData],
    root: Path,
    target: str,
    out: Path,
    fp: str,
    force: bool,
    options: dict[str, bool],
) -> VerifyReport:
    prepare_target(out, target, fp, force)
    paths, extra = backend(target).write(runs, out, **options)
    write_record(out, target, root, runs, fp, [*paths, VERIFY_FILE], {**extra, "options": options})
    report = _verify_runs(runs, target, out, read_record(out) or {})
    atomic_write_json(out / VERIFY_FILE, report.to_dict())
    return report


def verify(root: str | Path, target: str, out: str | Path | None = None) -> VerifyReport:
    """Re-check an existing export in ``out`` against the runs under ``root``; writes nothing."""
    check_target(target)
    root = Path(root)
    runs = load_runs(root)
    out = Path(out) if out is not None else _default_out(root, target)
    record = read_record(out)
    if record is None:
        raise FathomError(
            f"{str(out)!r} holds no Fathom export (no fathom-export.json); export first"
        )
    if record.get("target") != target:
        raise FathomError(
            f"{str(out)!r} holds a {record.get('target')} export, not {target}; pass --to {record.get('target')}"
        )
    report = _verify_runs(runs, target, out, record)
    if record.get("format") != FORMAT:
        report.mismatch(
            f"export format {record.get('format')} (format {FORMAT} writes accuracy in percent "
            "under <name>_pct); export again with --force"
        )
    options = record.get("options") or {}
    if record.get("fingerprint") != fingerprint(target, runs, _made_of(target, runs, options)):
        report.mismatch(
            "the run directories changed since this export (runs, history or analysis hashes "
            "differ); export again with --force"
        )
    return report


def _verify_runs(runs: list[RunData], target: str, out: Path, record: dict) -> VerifyReport:
    report = VerifyReport(
        target=target, out=out, flagged=_flagged(runs), unfinished=unfinished(runs)
    )
    if EXPORT_TARGETS[target].numbers_only:
        skipped = sorted({k for r in runs for row in r.rows for k in flatten_row(row)[1]})
        if skipped:
            report.notes.append(f"fields that are not numbers, left out of {target}: {skipped}")
    backend(target).read_back(runs, out, record, report)
    return report
