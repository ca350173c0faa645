"""The depth-scaling comparison as markdown and as an 80-column terminal table.

One line per seed value, ordered by depth then arm: the seed log's value, Fathom's (seed mean,
with the sample SD and range when there are several seeds), the difference (Fathom minus
seed) and whether the seed's value lies in Fathom's seed range. Accuracies, stored as
fractions like the log prints them, are rendered through :func:`fathom.base.units.percent`
(differences in percentage points). The verdicts follow: the log's own conclusion, Fathom's
rule on the log's numbers, Fathom's verdict on its own runs, each with both of Fathom's
answers (the level across depths and the scaling with depth).
"""

from __future__ import annotations

from typing import Any

from fathom.base.units import fmt_spread, fmt_value, percent

_FRACTION = "fraction of test images"
_SHORT = {
    "test_acc": "acc (%)",
    "lyapunov": "λ̂",
    "grad_norm": "∇norm",
    "kappa": "κ",
    "depth_delta": "Δ acc (pp)",
    "depth_change": "change (pp)",
}


def _is_fraction(row: dict[str, Any]) -> bool:
    return str(row["units"]).startswith(_FRACTION)


def _shown(row: dict[str, Any], x: float | None) -> float | None:
    return percent(x) if x is not None and _is_fraction(row) else x


def _unit(row: dict[str, Any]) -> str:
    """Accuracy rows print in percent, every other quantity as a plain number
    (:mod:`fathom.base.units`)."""
    return "%" if _is_fraction(row) else ""


def label(row: dict[str, Any]) -> tuple[str, str, str]:
    """``(depth, arm, quantity)`` of a row, for ordering and printing."""
    ex = row["extract"]
    if ex["kind"] == "depth_change":
        return f"{ex['from']}→{ex['to']}", ex["arm"], _SHORT["depth_change"]
    if ex["kind"] == "depth_delta":
        return str(ex["depth"]), "Lyap−van", _SHORT["depth_delta"]
    return str(ex["depth"]), ex["arm"], _SHORT[ex["metric"]]


def _fathom_cell(row: dict[str, Any], wide: bool) -> str:
    f = row["fathom"]
    if f is None:
        return "—"
    unit = _unit(row)
    if f["n"] > 1 and wide:
        shown = (_shown(row, f[k]) for k in ("mean", "sd", "min", "max"))
        return fmt_spread(*shown, f["n"], unit)
    return fmt_value(_shown(row, f["mean"]), unit)


def flags(row: dict[str, Any]) -> tuple[str, str]:
    """``(in range, note)``: yes / no / — and why a row is not judged on magnitude."""
    inside = {True: "yes", False: "no", None: "—"}[row["within_spread"]]
    if row["fathom"] is None:
        return inside, "none"
    if row.get("not_comparable"):
        return inside, "n/c"
    if row["verdict"].startswith("not comparable in magnitude"):
        return inside, "scaled"
    if row["verdict"].startswith("not comparable"):
        return inside, "n/c"
    return inside, f"n={row['fathom']['n']}"


def _table_rows(result: dict[str, Any], wide: bool = False) -> list[list[str]]:
    out = []
    for r in result["rows"]:
        depth, arm, qty = label(r)
        inside, note = flags(r)
        seed = fmt_value(_shown(r, float(r["seed_value"])), _unit(r) or "quoted")
        diff = fmt_value(_shown(r, r["difference"]), "pp" if _is_fraction(r) else "", signed=True)
        out.append([depth, arm, qty, seed, _fathom_cell(r, wide), diff, inside, note])
    return out


_COLUMNS = ["Depth", "Arm", "Quantity", "Seed", "Fathom", "Diff.", "In\nrange", "Note"]


def _by_depth(cells: dict[str, Any]) -> list[tuple[str, Any]]:
    """``cells.items()`` in numeric depth order (JSON keys are strings: "12" < "4")."""
    return sorted(cells.items(), key=lambda kv: int(kv[0]))


def _depth_lines(result: dict[str, Any]) -> list[str]:
    """``depth 4: vanilla trained, Lyapunov failed; Lyapunov vs vanilla: no comparison``."""
    out = []
    for depth, cells in _by_depth(result["cells"]):
        v = result["per_depth"].get(depth) or {}
        arms = ", ".join(f"{a} {cells.get(a, '—')}" for a in ("vanilla", "Lyapunov"))
        out.append(f"depth {depth}: {arms}; Lyapunov vs vanilla: {v.get('verdict', '—')}")
    return out


def _answers(v: dict[str, Any]) -> str:
    """``level: …; scaling: …`` of one verdict (a verdict without answers: its sentence)."""
    if v.get("verdict") != "judged" or "level" not in v:
        return v["sentence"]
    return f"level {v['level']}; scaling {v['trend']} — {v['sentence']}"


def _verdict_lines(result: dict[str, Any]) -> list[str]:
    out = []
    for table_id, v in result["verdicts"].items():
        yes = {True: "REACHES it", False: "does not reach it"}
        out += [
            f"[{table_id}] the seed log concluded: {v['seed_conclusion']!r} "
            f"(a claim about scaling: the Lyapunov arm {v['seed_claim']})",
            f"  Fathom's rule on the seed log's own numbers: {_answers(v['rule_on_seed_log'])} "
            f"— {yes[v['rule_on_seed_log']['reaches_seed_claim']]}",
            f"  Fathom's verdict on Fathom's runs: {_answers(v['fathom'])} "
            f"— {yes[v['fathom']['reaches_seed_claim']]}",
        ]
    return out


def notes(result: dict[str, Any]) -> list[str]:
    out = [result["caveat"]]
    if result["scale_down"]:
        out.append(
            "Scaled-down run: not comparable in magnitude with the log's full-size numbers. "
            f"Scaled down: {'; '.join(result['scale_down'])}."
        )
    out.append(
        "Seed: the log's value; Fathom: seed mean (± sample SD [min, max] (n) in the markdown); "
        "Diff.: Fathom minus seed; in range: min <= seed value <= max over Fathom's seeds "
        "(n >= 2); accuracy in %, differences in pp; n/c: another definition (see markdown)."
    )
    return out


def definitions(result: dict[str, Any]) -> list[str]:
    """Per quantity (acc, λ̂, ∇norm, κ, ...), what the log's number and Fathom's are: each
    distinct ``statistic`` and ``not_comparable`` text of its rows, and the fitting-set
    size(s) of Fathom's runs (``fit_sizes``) beside the accuracy's."""
    seen: dict[str, list[str]] = {}
    for r in result["rows"]:
        texts = seen.setdefault(label(r)[2], [])
        for t in (r.get("statistic"), r.get("not_comparable")):
            if t and t not in texts:
                texts.append(t)
    out = [f"{qty}: {'; '.join(texts)}." for qty, texts in seen.items() if texts]
    sizes = result.get("fit_sizes") or []
    if sizes:
        fit = ", ".join(f"{n:,}" for n in sizes)
        out.append(
            f"Fathom's runs fit on {fit} training images (the rest held out for validation, "
            "which selects the epoch whose test accuracy is reported); the log's accuracy is "
            "its last epoch's, on a run fitted on all 50,000."
        )
    return out


def to_markdown(result: dict[str, Any]) -> str:
    """``reproduction.md`` of a depth-scaling pipeline."""
    lines = [f"# Reproduction: {result['dataset']} depth scaling beside seed 000's log", ""]
    lines += [n + "\n" for n in notes(result)]
    lines += ["## Definitions: the log's number and Fathom's", ""]
    lines += [f"- {d}" for d in definitions(result)] + [""]
    for t in result["tables"]:
        lines += [
            f"## {t['title']}",
            "",
            f"Source: {t['source']}. Fathom's counterpart: {t['counterpart']}.",
            "",
            "| Depth | Arm | Quantity | Seed | Fathom | Difference | In range | Verdict |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r, cells in zip(result["rows"], _table_rows(result, wide=True), strict=True):
            lines.append("| " + " | ".join([*cells[:7], r["verdict"]]) + " |")
        lines.append("")
    lines += ["## Fathom per depth: each arm's cell and Lyapunov vs vanilla", ""]
    lines += [f"- {line}" for line in _depth_lines(result)]
    for depth, fails in _by_depth(result["failures"]):
        lines.append(f"  - depth {depth} failure flags: {'; '.join(fails)}")
    lines += ["", "## Verdicts", ""]
    lines += [f"- {line.strip()}" for line in _verdict_lines(result)]
    return "\n".join(lines) + "\n"


def print_comparison(result: dict[str, Any], console: Any = None) -> None:
    """The side-by-side table, its notes and the verdicts on an 80-column terminal."""
    from rich.console import Console

    from fathom.base.terminal import table

    console = console or Console()
    title = f"Seed 000's {result['dataset']} depth-scaling table beside Fathom's"
    right = ["Seed", "Fathom", "Diff."]
    console.print(table(title, _COLUMNS, _table_rows(result), right=right))
    for line in notes(result) + _depth_lines(result) + _verdict_lines(result):
        console.print(line, highlight=False, markup=False)
