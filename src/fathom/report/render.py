"""Renderers of :class:`fathom.report.crosstable.CrossTable`: markdown and HTML, one cell format.

Cell formats by column kind, each by its unit's rule in :mod:`fathom.base.units`: ``num`` 4
significant digits; ``pct`` two decimals (values already in percent, the unit in the
label); ``pp`` signed two decimals; ``ratio`` ``"19.2×"``; ``spread`` ``"mean (min–max)"``
in the column's number format; ``—`` for undefined.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.base.units import fmt_value
from fathom.report.crosstable import Column, CrossTable
from fathom.report.tables import esc
from fathom.stats.results import NOT_ESTABLISHED
from fathom.stats.sentences import rest_note

# column kind -> (unit of fathom.base.units, signed); the unit text is in the column label
_KIND_UNITS = {"pct": ("%", False), "%": ("%", False), "pp": ("pp", True), "ratio": ("×", False),
              "int": ("count", False), "num": ("", False)}  # fmt: skip


def number(v: float | None, kind: str = "num") -> str:
    """``v`` by its column kind through :func:`fathom.base.units.fmt_value` (``ratio`` keeps its
    ``×``; the other units are in the column label)."""
    unit, signed = _KIND_UNITS.get(kind, ("", False))
    return fmt_value(v, unit, signed=signed, suffix=unit == "×")


def _cell_text(value: Any, col: Column) -> str:
    if value is None:
        return "—"
    if col.kind == "text":
        return str(value)
    if col.kind == "spread":
        if not isinstance(value, Mapping):
            return "—"
        kind = "pct" if col.unit == "%" else "num"
        mean = number(value["mean"], kind)
        if value["n"] < 2:
            return f"{mean} (n=1)"
        return f"{mean} ({number(value['min'], kind)}–{number(value['max'], kind)})"
    return number(value, col.kind)


def _headline_verdicts(t: CrossTable) -> tuple[list[str], list[str]]:
    """``(headline, rest)`` sentences of a table's computed contrasts: the headline holds,
    at each recipe's latest compared epoch, every contrast that is not "not established"
    (a direction, or a "no comparison" naming its reason); the rest holds every other."""
    latest: dict[str, int] = {}
    for v in t.verdicts:
        latest[v["recipe"]] = max(latest.get(v["recipe"], v["epoch"]), v["epoch"])
    head, rest = [], []
    for v in t.verdicts:
        shown = v["epoch"] == latest[v["recipe"]] and v["verdict"] != NOT_ESTABLISHED
        (head if shown else rest).append(v["sentence"])
    return head, rest


def _rest_note(rest: list[str]) -> str:
    return rest_note(len(rest))


def table_markdown(t: CrossTable) -> str:
    lines = [f"### {t.title}", "", t.note, ""]
    lines.append("| " + " | ".join(c.label for c in t.columns) + " |")
    lines.append("|" + "---|" * len(t.columns))
    for row in t.rows:
        lines.append("| " + " | ".join(_cell_text(row.get(c.key), c) for c in t.columns) + " |")
    if t.verdicts:
        head, rest = _headline_verdicts(t)
        lines += ["", *[f"- {x}" for x in head]]
        if rest:
            lines.append(f"- {_rest_note(rest)}")
    return "\n".join(lines) + "\n"


def collapsed_sentences(texts: list[str], summary: str, *, id_: str = "") -> str:
    """``texts`` collapsed into ``summary`` (escaped here, a count in it) that opens onto
    the list: the sentences a first reading can pass over (not established, or earlier)."""
    if not texts:
        return ""
    tid = f" id='{esc(id_)}'" if id_ else ""
    return (
        f"<details class='undecided'{tid}><summary>{esc(summary)}</summary>"
        "<ul class='verdicts'>" + "".join(f"<li>{esc(x)}</li>" for x in texts) + "</ul></details>"
    )


def _verdicts_html(t: CrossTable) -> str:
    """The table's contrast sentences: the headline as a list, every other one collapsed
    into its count (:func:`collapsed_sentences`)."""
    if not t.verdicts:
        return ""
    head, rest = _headline_verdicts(t)
    items = "".join(f"<li>{esc(x)}</li>" for x in head)
    out = f"<ul class='verdicts' id='verdicts-{esc(t.name)}'>{items}</ul>"
    return out + collapsed_sentences(rest, _rest_note(rest) + " Show them.")


def table_html(t: CrossTable, table_id: str | None = None) -> str:
    tid = f' id="{esc(table_id)}"' if table_id else ""
    head = "".join(
        f'<th class="{"" if c.kind == "text" else "num"}">{esc(c.label)}</th>' for c in t.columns
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"" if c.kind == "text" else "num"}">{esc(_cell_text(row.get(c.key), c))}</td>'
            for c in t.columns
        )
        + "</tr>"
        for row in t.rows
    )
    return (
        _verdicts_html(t)
        + f'<table class="headline"{tid} data-table="{esc(t.name)}"><caption>{esc(t.title)}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        f'<p class="note">{esc(t.note)}</p>'
    )
