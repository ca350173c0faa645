"""``fathom report DIR``: report.html, PNG figures and a summary.md that links them.

Inputs, all optional except the runs: ``DIR/summary.json`` and ``DIR/summary.md`` (the
study's), ``DIR/audit/audit.json`` with its ``.npz``, ``<run>/curvature/*.json``. Outputs:
``report.html``, ``summary.md`` (cross-run tables, then the study's summary),
``summary.json`` (the cross-run tables as data, units stated) and ``figures/*.png`` (written
first: report.html embeds the language model's figures as data-URI images, so the page
stays one self-contained file). An optional input that
does not parse is named in the report's warnings, never fatal. Outputs go to
``DIR/report/`` unless ``out`` is given (so the study's own summary.md is never
overwritten).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fathom.report import figures
from fathom.report.crossrun import crossrun_tables, default_reference, study_alignment
from fathom.report.crosstable import CrossTable
from fathom.report.examples import mask_payload
from fathom.report.html import render_html
from fathom.report.lm import is_lm_audit, lm_figures, lm_html, lm_section
from fathom.report.render import table_markdown
from fathom.report.runs import RunData, load_runs, unfinished
from fathom.rundir.output import AnalysisOutput, analysis_output
from fathom.rundir.reader import read_audit, read_curvature


@dataclass
class ReportOutputs:
    html: Path
    summary_md: Path
    figures: list[Path] = field(default_factory=list)
    runs: int = 0
    flagged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # runs running or interrupted


def _read_optional(path: Path, notes: list[str]) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        notes.append(f"{path} does not parse ({e}); it is left out of the report")
        return None


def load_curvature(runs: list[RunData], notes: list[str]) -> dict[str, dict[str, Any]]:
    """``run_id -> {"summary": summary.json, "epochs": {epoch: epoch-NNNN.json}}``, each run's
    :func:`fathom.rundir.reader.read_curvature` record as JSON (unreadable files noted)."""
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        record = read_curvature(run.path, notes)
        if record is not None:
            out[run.run_id] = record.to_json()
    return out


def build_report(
    root: str | Path, out: str | Path | None = None, *, with_figures: bool = True
) -> ReportOutputs:
    """Write the report of every run under ``root``; see the module docstring. The outputs are
    written under the lock of ``root`` (its run or study lock, or the output's own,
    :func:`fathom.rundir.output.analysis_output`): refused, naming the holder's PID, while a
    trainer, a study or another analysis writes there."""
    root = Path(root)
    runs = load_runs(root)  # a path without runs is refused before anything is written
    with analysis_output(root, "report", out) as output:
        return _write_report(root, runs, output, with_figures)


def _write_report(
    root: Path, runs: list[RunData], output: AnalysisOutput, with_figures: bool
) -> ReportOutputs:
    out_dir = output.dir
    notes: list[str] = []
    summary = _read_optional(root / "summary.json", notes)
    audit_record = read_audit(root, notes)
    audit = None if audit_record is None else audit_record.raw
    lm_audit = audit if is_lm_audit(audit) else None  # a language model's: report.lm
    audit = None if lm_audit else audit
    curvature = load_curvature(runs, notes)
    reference = default_reference(runs, summary)
    alignment = study_alignment(runs, reference)
    tables = crossrun_tables(runs, reference, curvature, alignment)
    masks = mask_payload(audit, root / "audit", {r.run_id: r for r in runs}) if audit else None

    notes += [f"{r.run_id}: recovered: {x}" for r in runs for x in r.recovery]  # repairs
    made: list[Path] = []
    lm_made: list[Path] = []
    if with_figures:  # before the page: it embeds the language model's figures
        made += figures.all_figures(runs, audit, out_dir / "figures")
        lm_made = lm_figures(runs, lm_audit, out_dir / "figures")
        made += lm_made
    title = f"Fathom report: {root.resolve().name}"
    waiting = unfinished(runs)  # said in the header of every output
    html_path = output.text(
        "report.html",
        render_html(
            title,
            runs,
            summary=summary,
            audit=audit,
            curvature=curvature,
            crossrun=tables,
            masks=masks,
            notes=notes,
            alignment=alignment,
            unfinished=waiting,
            reference=reference,
            language_model=lm_html(runs, lm_audit, root, lm_made),
        ),
    )
    output.json(
        "summary.json",
        {
            "kind": "fathom.report.crossrun",
            "reference": reference,
            "units": "accuracy and zero-activation fractions in percent (%), differences in "
            "percentage points (pp), CE in nats; history.jsonl keeps fractions in [0, 1]",
            "tables": [t.to_dict() for t in tables],
        },
    )

    flagged = [f"{r.run_id}: {reason}" for r in runs for reason in r.flag_reasons]
    md_path = output.text(
        "summary.md",
        _summary_markdown(
            title,
            runs,
            out_dir,
            made,
            root,
            flagged,
            notes,
            audit is not None or lm_audit is not None,
            tables,
            lm_section(runs, lm_audit, root),
        ),
    )
    return ReportOutputs(html_path, md_path, made, len(runs), flagged, notes, waiting)


def _status(r: RunData) -> str:
    """``complete`` / ``running, 3 of 10 epochs``: the status, with progress if unfinished."""
    if r.state is None or r.state.finished:
        return str(r.status)
    return f"{r.state.status}, {r.state.progress}"


def _demoted(md: str) -> str:
    """Markdown headings one level deeper (an included file's ``#`` becomes ``##``)."""
    return "\n".join("#" + line if line.startswith("#") else line for line in md.splitlines())


def _summary_markdown(
    title: str,
    runs: list[RunData],
    out_dir: Path,
    made: list[Path],
    root: Path,
    flagged: list[str],
    notes: list[str],
    has_audit: bool,
    tables: list[CrossTable] = (),  # type: ignore[assignment]
    language_model: list[str] = (),  # type: ignore[assignment]
) -> str:
    """The answer first (the study's own summary: verdicts and main table), then figures,
    the cross-run tables, the runs and anything flagged."""
    lines = [f"# {title}", ""]
    notice = [f"> **Not finished**: {x}" for x in unfinished(runs)]  # a snapshot, said first
    lines += [*notice, ""] if notice else []
    lines += ["Interactive explorer: [report.html](report.html)", ""]
    study_md = root / "summary.md"
    if study_md.exists():
        lines += ["## Study summary", "", _demoted(study_md.read_text().strip()), ""]
    lines += language_model  # report.lm.lm_section: curves, audit, scaling verdict
    if made:
        lines += ["## Figures", ""]
        lines += [
            f"![{p.stem.replace('_', ' ')}]({p.relative_to(out_dir).as_posix()})" for p in made
        ]
        lines.append("")
    if not has_audit:
        lines += ["_No audit/audit.json in this directory: no mask-damage figure._", ""]
    lines += _loss_section(runs)
    if tables:
        lines += [
            "## Cross-run tables",
            "",
            "Accuracy in %, differences in percentage points (pp), CE in nats; the same "
            "tables as data in summary.json.",
            "",
        ]
        lines += ["#" + table_markdown(t) for t in tables]
    lines += [
        "## Runs",
        "",
        "| run | cohort | seed | status | history rows | flagged |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.run_id} | {r.cohort} | {r.seed} | {_status(r)} | {len(r.rows)} "
            f"| {'; '.join(r.flag_reasons) or '—'} |"
        )
    if flagged or notes:
        lines += ["", "## Flagged input", "", *[f"- {x}" for x in [*flagged, *notes]]]
    return "\n".join(lines) + "\n"


def _loss_section(runs: list[RunData]) -> list[str]:
    """The ``## Training loss`` section of ``summary.md`` where a run trained with a
    ``[loss]`` table (empty otherwise): per such run its loss, the epoch it selected by that
    loss's validation value (``selected.val_loss``: :func:`fathom.config.run.objective_field`)
    and that value, and its last recorded ``val/loss`` and ``test/loss``, in the loss's units
    (nats only for the cross-entropies)."""
    lines = []
    for r in runs:
        table = r.config.get("loss")
        if not isinstance(table, dict):
            continue
        said = ", ".join(f"{k} {v}" for k, v in table.items() if k != "name")
        sel = r.recorded.selected
        epoch = sel.epoch if "epoch" in sel.given() else "—"
        last = next((row for row in reversed(r.rows) if row.get("val/loss") is not None), {})
        cells = (sel.val_loss, last.get("val/loss"), last.get("test/loss"))
        lines.append(
            f"| {r.run_id} | {table.get('name')} ({said}) | {epoch} | "
            + " | ".join("—" if v is None else f"{v:.6g}" for v in cells)
            + f" | {last.get('epoch', '—')} |"
        )
    if not lines:
        return []
    return [
        "## Training loss",
        "",
        "Runs trained with a `[loss]` table select their checkpoint by its validation value "
        "(`val/loss`), in that loss's units; CE (nats) is recorded beside it.",
        "",
        "| run | loss | selected epoch | selected val loss | last val loss | last test loss "
        "| at epoch |",
        "|---|---|---|---|---|---|---|",
        *lines,
        "",
    ]
