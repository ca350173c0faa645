"""``fathom report DIR``: report.html, PNG figures and a summary.md that links them.

Inputs, all optional except the runs: ``DIR/summary.json`` and ``DIR/summary.md`` (the
study's), ``DIR/audit/audit.json``, ``<run>/curvature/*.json``. An optional input that
does not parse is named in the report's warnings, never fatal. Outputs go to
``DIR/report/`` unless ``out`` is given (so the study's own summary.md is never
overwritten).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fathom.io import atomic_write_text, ensure_writable_dir
from fathom.report import figures
from fathom.report.html import render_html
from fathom.report.runs import RunData, load_runs


@dataclass
class ReportOutputs:
    html: Path
    summary_md: Path
    figures: list[Path] = field(default_factory=list)
    runs: int = 0
    flagged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _read_optional(path: Path, notes: list[str]) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        notes.append(f"{path} does not parse ({e}); it is left out of the report")
        return None


def _curvature(runs: list[RunData], notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for run in runs:
        for p in sorted((run.path / "curvature").glob("*.json")):
            value = _read_optional(p, notes)
            if value is not None:
                out[f"{run.run_id}/{p.name}"] = value
    return out


def build_report(
    root: str | Path, out: str | Path | None = None, *, with_figures: bool = True
) -> ReportOutputs:
    """Write the report of every run under ``root``; see the module docstring."""
    root = Path(root)
    runs = load_runs(root)
    out_dir = ensure_writable_dir(Path(out) if out is not None else root / "report")
    notes: list[str] = []
    summary = _read_optional(root / "summary.json", notes)
    audit = _read_optional(root / "audit" / "audit.json", notes)
    curvature = _curvature(runs, notes)

    title = f"Fathom report: {root.resolve().name}"
    html_path = out_dir / "report.html"
    atomic_write_text(
        html_path,
        render_html(title, runs, summary=summary, audit=audit, curvature=curvature, notes=notes),
    )

    made: list[Path] = []
    if with_figures:
        for fig in (
            figures.learning_curves(runs, out_dir / "figures" / "learning_curves.png"),
            figures.mask_damage(audit, out_dir / "figures" / "mask_damage.png") if audit else None,
        ):
            if fig is not None:
                made.append(fig)
    flagged = [f"{r.run_id}: {reason}" for r in runs for reason in r.flag_reasons]
    md_path = out_dir / "summary.md"
    atomic_write_text(
        md_path,
        summary_markdown(title, runs, out_dir, made, root, flagged, notes, audit is not None),
    )
    return ReportOutputs(html_path, md_path, made, len(runs), flagged, notes)


def summary_markdown(
    title: str,
    runs: list[RunData],
    out_dir: Path,
    made: list[Path],
    root: Path,
    flagged: list[str],
    notes: list[str],
    has_audit: bool,
) -> str:
    lines = [f"# {title}", "", "Interactive explorer: [report.html](report.html)", ""]
    if made:
        lines += ["## Figures", ""]
        lines += [
            f"![{p.stem.replace('_', ' ')}]({p.relative_to(out_dir).as_posix()})" for p in made
        ]
        lines.append("")
    if not has_audit:
        lines += ["_No audit/audit.json in this directory: no mask-damage figure._", ""]
    lines += [
        "## Runs",
        "",
        "| run | cohort | seed | status | history rows | flagged |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.run_id} | {r.cohort} | {r.seed} | {r.manifest.get('status')} | {len(r.rows)} "
            f"| {'; '.join(r.flag_reasons) or '—'} |"
        )
    if flagged or notes:
        lines += ["", "## Flagged input", "", *[f"- {x}" for x in [*flagged, *notes]]]
    study_md = root / "summary.md"
    if study_md.exists():
        lines += ["", "## Study summary", "", study_md.read_text().strip()]
    return "\n".join(lines) + "\n"
