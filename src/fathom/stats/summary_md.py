"""Markdown rendering of a study summary (:func:`fathom.stats.summary.summarise_study`).

It lays out the summary's typed tables (:mod:`fathom.stats.summary_tables`) and prints every
cell through :func:`fathom.stats.numbers.fmt_cell` (one formatter per unit,
:mod:`fathom.base.units`): values are mean ± sample SD over seeds, accuracy in percent,
differences in percentage points, CE in nats; no number is derived here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.stats.numbers import table_text
from fathom.stats.results import Table
from fathom.stats.summary_tables import tables_of


def table_markdown(table: Table, *, title: bool = True) -> list[str]:
    """A :class:`Table` as a Markdown table (its title as a lead line when ``title``)."""
    lines = [f"{table.title}:", ""] if title else []
    lines += [
        "| " + " | ".join(table.columns) + " |",
        "|" + "---|" * len(table.columns),
        *("| " + " | ".join(r) + " |" for r in table_text(table)),
    ]
    return lines


def to_markdown(summary: Mapping[str, Any]) -> str:
    """Render :func:`fathom.stats.summary.summarise_study` output as markdown tables (mean ± sample SD)."""
    tables = tables_of(summary)
    lines = [
        f"Reference recipe: **{summary['reference']}**. Values are mean ± sample SD over n seeds "
        "(a cell's own n is stated when it differs from its row's).",
        "",
        *table_markdown(tables["quality"]),
        "",
        *table_markdown(tables["differences"]),
        "",
        *[f"- {c['sentence']}" for c in summary["comparisons"]],
        "",
        *table_markdown(tables["timing"]),
    ]
    lines += _rankings(summary, tables)
    if summary["excluded"]:
        lines += ["", "Excluded runs (no comparison):", ""]
        lines += [
            f"- {x['recipe']} seed {x['seed']}: {', '.join(x['flags'])}"
            for x in summary["excluded"]
        ]
    lines += ["", *[f"_{n}_" for n in summary["notes"]], ""]
    return "\n".join(lines)


def _rankings(summary: Mapping[str, Any], tables: Mapping[str, Table]) -> list[str]:
    """Per metric: the ranking statement (:mod:`fathom.stats.ranking`), the pairwise
    comparisons it rests on and, when the means reorder, both rankings side by side."""
    lines: list[str] = []
    for metric, rk in summary["rankings"].items():
        claim = rk.get("claim")
        if claim is None:
            continue
        lines += ["", claim["sentence"], "", *table_markdown(tables[f"pairs/{metric}"])]
        if rk["disagree"]:
            lines += ["", *table_markdown(tables[f"ranking/{metric}"])]
    return lines
