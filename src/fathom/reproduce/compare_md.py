"""``reproduction.md`` of a study pipeline: each seed table with Fathom's side, every label true.

One markdown table per seed table (:func:`fathom.reproduce.compare.comparison`'s result).
Columns: the quantity (in the seed's words), units, the epoch on each side (``seed →
Fathom``: the scaled-down study's counterpart of the seed's epoch 100 is its last epoch),
the seed's value, Fathom's (seed mean ± sample SD [min, max] (n)), the difference
(Fathom mean − seed value), whether the seed's value lies in Fathom's seed-to-seed range,
and the verdict. A count the seed gives out of its own total (``0/958``) is printed with
each side's own denominator and compared as a rate, in percentage points.
"""

from __future__ import annotations

from typing import Any

from fathom.base.units import fmt_spread, fmt_value
from fathom.reproduce.head import collapse_lines


def _num(x: Any, unit: str = "") -> str:
    """A plain number (:func:`fathom.base.units.fmt_value`, unit ``""``); the seed's own values
    print as quoted (unit ``"quoted"``); a list element by element."""
    if isinstance(x, list):
        return ", ".join(_num(v, unit) for v in x)
    return fmt_value(None if x is None else float(x), unit)


def _epochs(row: dict[str, Any]) -> list[int]:
    return sorted(set((row.get("fathom_epochs") or {}).values()))


def _epoch_cell(row: dict[str, Any]) -> str:
    """``"100 → 5"``, ``"selected → selected (epochs 4, 5)"``, ``"—"`` for a whole-run value."""
    seed, own = row.get("seed_epoch"), _epochs(row)
    if seed is None and not own:
        return "—"
    fathom = ", ".join(str(e) for e in own) or "—"
    if seed == "selected":
        plural = "s" if len(own) > 1 else ""
        fathom = f"selected (epoch{plural} {fathom})" if own else "selected"
    return f"{'—' if seed is None else seed} → {fathom}"


def _seed_cell(row: dict[str, Any]) -> str:
    if row.get("seed_rate") is not None:
        return f"{_num(row['seed_value'], 'quoted')}/{row['seed_denominator']} ({fmt_value(row['seed_rate'], '%')})"
    return _num(row["seed_value"], "quoted")


def _fathom_cell(row: dict[str, Any]) -> str:
    f = row["fathom"]
    if f is None:
        return "—"
    counts = row.get("fathom_counts")
    if counts:
        per = "; ".join(f"{c:g}/{t}" for c, t in counts.values())
        return f"{per} ({fmt_spread(f['mean'], f['sd'], f['min'], f['max'], f['n'], '%')})"
    return fmt_spread(f["mean"], f["sd"], f["min"], f["max"], f["n"], "")


def _difference_cell(row: dict[str, Any]) -> str:
    if row.get("seed_rate") is not None and row["difference"] is not None:
        return f"{fmt_value(row['difference'], 'pp', signed=True)} (rates)"
    return _num(row["difference"])


def range_cell(row: dict[str, Any]) -> str:
    """Whether the seed's value lies in Fathom's seed-to-seed range (shown on every row,
    comparable in magnitude or not)."""
    f = row["fathom"]
    if f is None:
        return "—"
    if row["within_spread"] is None:
        return f"— (n = {f['n']}: no range)"
    if row["within_spread"]:
        return "yes"
    seed = row["seed_rate"] if row.get("seed_rate") is not None else row["seed_value"]
    return f"no (seed {'above' if float(seed) > f['max'] else 'below'})"


def _epoch_summary(rows: list[dict[str, Any]]) -> str | None:
    """``"seed epoch 100 → Fathom epoch 5"`` over a table's rows with a numeric seed epoch."""
    pairs: dict[int, set[int]] = {}
    for r in rows:
        if isinstance(r.get("seed_epoch"), int) and _epochs(r):
            pairs.setdefault(r["seed_epoch"], set()).update(_epochs(r))
    if not pairs:
        return None
    return "; ".join(
        f"seed epoch {s} → Fathom epoch {', '.join(str(e) for e in sorted(f))}"
        for s, f in sorted(pairs.items())
    )


_COLUMNS = (
    "| Quantity (seed's words) | Units | Epoch (seed → Fathom) | Seed | Fathom | Difference "
    "| In Fathom's range | Verdict |"
)


def _header(result: dict[str, Any]) -> list[str]:
    d = result["definitions"]
    lines = [
        f"# Reproduction: {result['study']} beside the seeds",
        "",
        result["caveat"],
        "",
        f"Fathom cell: mean ± sample SD [min, max] (n seeds). Difference: {d['difference']}. "
        f"In Fathom's range: {d['within_spread']}; shown on every row, also where magnitudes "
        "are not comparable. Epoch: the seed's epoch → the epoch of Fathom's checkpoint or "
        "snapshot the value was read at. A count is printed over its own total on each "
        "side and compared as a rate (percentage points).",
        f"Device(s): {', '.join(result['devices']) or '?'}.",
        "",
    ]
    if not result["comparable_in_magnitude"]:
        lines += [
            "**Scaled-down run: not comparable in magnitude with the seeds' full-size numbers.** "
            f"Scaled down: {'; '.join(result['scale_down'])}.",
            "",
        ]
    return lines


def _table(table: dict[str, Any], rows: list[dict[str, Any]], result: dict[str, Any]) -> list[str]:
    epochs = _epoch_summary(rows)
    if epochs is None and table.get("seed_epochs") is not None and result.get("final_epochs"):
        fathom = ", ".join(str(e) for e in result["final_epochs"])
        epochs = f"seed epoch {table['seed_epochs']} → Fathom epoch {fathom} (final checkpoint)"
    title = table["title"] + (f" — {epochs}" if epochs else "")
    lines = [
        f"## {title}",
        "",
        f"Source: {table['source']}. Fathom's counterpart: {table['counterpart']}.",
        "",
    ]
    if rows:
        lines += [_COLUMNS, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["quantity"], r["units"], _epoch_cell(r), _seed_cell(r), _fathom_cell(r)]
        cells += [_difference_cell(r), range_cell(r), r["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    if table["id"] == "head" and result.get("head_collapse"):
        lines += ["", *(f"- {line}" for line in collapse_lines(result["head_collapse"]))]
    if "fathom_table_md" in table:
        lines += [
            "",
            (
                "The seed's text gives no numbers of this table beyond the rows above"
                if rows
                else "The seed's text gives no numbers of this table"
            )
            + "; Fathom's side, computed from the run directories (fathom.report.crossrun):",
            "",
            table["fathom_table_md"],
        ]
    return [*lines, ""]


def to_markdown(result: dict[str, Any]) -> str:
    """The comparison as markdown: one table per seed table, definitions above them."""
    lines = _header(result)
    for table in result["tables"]:
        lines += _table(table, [r for r in result["rows"] if r["table"] == table["id"]], result)
    return "\n".join(lines)
