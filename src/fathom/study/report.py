"""Print a study summary (``summary.json`` contents) as tables that fit 80 columns.

Accuracy is in percent, its differences in percentage points (pp), cross-entropy in nats.
Recipe names, statuses and verdict words are never wrapped or cut
(:mod:`fathom.base.terminal`); the paired differences are one table per checkpoint so that
each row fits.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from fathom.base.terminal import table
from fathom.base.units import fmt_level
from fathom.stats.numbers import table_text
from fathom.stats.results import Table
from fathom.stats.summary_tables import tables_of, tuning_table
from fathom.study.markdown import integrity_markdown, scale_down_text


def _terminal(
    t: Table,
    labels: dict[str, str] | None = None,
    *,
    title: str | None = None,
    where: tuple[str, str] | None = None,
    wrap: tuple[str, ...] = (),
):
    """``t`` for the terminal: the columns named in ``labels`` (relabelled, stacked to fit
    80 columns; all when ``None``), the rows whose text cell ``where = (column, value)``
    matches; every cell printed by :func:`fathom.stats.numbers.fmt_cell`, its unit in the
    header."""
    keep = list(range(len(t.columns))) if labels is None else [t.columns.index(c) for c in labels]
    heads = list(t.columns) if labels is None else list(labels.values())
    text = table_text(t, suffix=False)
    if where is not None:
        col = t.columns.index(where[0])
        text = [r for r, cells in zip(text, t.rows) if cells[col].text == where[1]]
    return table(
        title or t.title,
        heads,
        [[r[i] for i in keep] for r in text],
        wrap=[(labels or {}).get(c, c) for c in wrap],
    )


_QUALITY = {
    "Method": "Method",
    "LR": "LR",
    "n": "n",
    "Selected test accuracy (%)": "Selected\nacc (%)",
    "Final test accuracy (%)": "Final\nacc (%)",
    "Final test CE (nats)": "Final CE\n(nats)",
    "Flags": "Flags",
}
_DIFFERENCES = {
    "Method": "Method",
    "Test metric (unit)": "Metric",
    "Difference": "Difference",
    "Interval": "Holm interval",
    "n": "n",
    "Verdict": "Verdict",
}
_TIMING = {
    "Method": "Method",
    "n": "n",
    "Fixed-horizon training clock (s)": "Training\nclock (s)",
    "Ratio to reference (×)": "Ratio\nto ref. (×)",
    "Time to target, training (s)": "To target,\ntraining (s)",
    "Time to target, elapsed (s)": "To target,\nelapsed (s)",
    "Reached": "Reached",
}
_TUNING = {
    "Method": "Method",
    "LR": "LR",
    "Status": "Status",
    "Min validation CE (nats)": "Min val\nCE (nats)",
    "At epoch": "At\nepoch",
    "Diverged in epoch": "Diverged\nin epoch",
    "Selected": "Selected",
}


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """The tables of ``summary.md``, for the terminal (80 columns)."""
    console = console or Console()
    stats = summary["stats"]
    console.rule(f"Study {summary['study']}")
    console.print(scale_down_text(summary))
    console.print(f"Device(s): {', '.join(summary['devices'])}")
    for line in integrity_markdown(summary):
        if line:
            console.print(line, overflow="fold")
    tuning = tuning_table(summary["tuning"])
    console.print(_terminal(tuning, _TUNING if tuning.id == "tuning" else None))
    tables = tables_of(stats)
    console.print(_terminal(tables["quality"], _QUALITY, wrap=("Flags",)))
    for checkpoint in ("selected", "final"):
        title = (
            f"Paired differences (method − {stats['reference']}), {checkpoint} checkpoint, "
            f"intervals at their Holm-step levels over n paired seeds (nominal "
            f"{fmt_level(stats['level'])})"
        )
        where = ("Checkpoint", checkpoint)
        console.print(_terminal(tables["differences"], _DIFFERENCES, title=title, where=where))
    console.print(_terminal(tables["timing"], _TIMING))
    for metric, rk in stats["rankings"].items():
        claim = rk.get("claim")
        if claim is not None:
            console.print(claim["sentence"], overflow="fold")
            console.print(_terminal(tables[f"ranking/{metric}"]))
    console.print("[bold]Verdicts[/bold]")
    for c in stats["comparisons"]:
        console.print(f"- {c['sentence']}")
    for x in stats["excluded"]:
        console.print(f"- excluded: {x['recipe']} seed {x['seed']} ({', '.join(x['flags'])})")
    for note in stats["notes"]:
        console.print(f"[dim]{note}[/dim]")
