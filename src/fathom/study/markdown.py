"""``summary.md``: the study summary rendered as Markdown (``summary.json`` holds every number).

The terminal rendering of the same summary is :mod:`fathom.study.report`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fathom.base.io import atomic_write_text, dumps
from fathom.stats import to_markdown
from fathom.stats.summary_md import table_markdown
from fathom.stats.summary_tables import tuning_table


def integrity_markdown(summary: dict[str, Any]) -> list[str]:
    """The runs this invocation retried (and why) and any problem left in a run directory."""
    retried = (summary.get("execution") or {}).get("retried") or []
    problems = summary.get("integrity") or {}
    sources = summary.get("sources") or {}
    source_line = [sources["sentence"], ""] if sources.get("sentence") else []
    if not retried and not problems:
        return [
            "Every run directory verified intact (manifest, history and checkpoint digests).",
            "",
            *source_line,
        ]
    lines = [f"- {r['run_id']}: {r['note']}" for r in retried]
    lines += [f"- {rid}: {'; '.join(p)}" for rid, p in sorted(problems.items())]
    return [*lines, "", *source_line]


def scale_down_text(summary: dict[str, Any]) -> str:
    """What was scaled down (computed by :func:`fathom.study.scaledown.scaled_down`)."""
    if "scale_down_sentence" in summary:
        return summary["scale_down_sentence"]
    notes = "; ".join(summary.get("scale_down") or []) or "none"
    return (
        f"Scale-down not computed in this older summary (the study's own notes: {notes}); "
        "rerun `fathom study run` to compute it."
    )


def tuning_markdown(summary: dict[str, Any]) -> list[str]:
    """The learning-rate selection (:func:`fathom.stats.summary_tables.tuning_table`)."""
    return [*table_markdown(tuning_table(summary["tuning"])), ""]


def write_summary(root: Path, summary: dict[str, Any]) -> None:
    """``summary.json`` (every number) and ``summary.md`` at the study root, atomically."""
    md = [
        f"# Study {summary['study']}",
        "",
        summary["description"],
        "",
        scale_down_text(summary),
        f"Device(s): {', '.join(summary['devices'])}.",
        "",
        "## Tuning",
        "",
        *tuning_markdown(summary),
        "## Run directories",
        "",
        *integrity_markdown(summary),
        "## Main phase",
        "",
        to_markdown(summary["stats"]),
    ]
    atomic_write_text(root / "summary.json", dumps(summary, indent=2) + "\n")
    atomic_write_text(root / "summary.md", "\n".join(md))
