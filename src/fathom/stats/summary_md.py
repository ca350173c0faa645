"""Markdown rendering of a study summary (:func:`fathom.stats.summary.summarise_study`).

Values are mean ± sample SD over seeds (n stated); accuracy (fractions in the summary)
in percent through :func:`fathom.stats.units.percent`, differences in percentage points,
CE in nats; every number through :mod:`fathom.stats.numbers` (one formatter per unit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.stats.numbers import fmt_level, fmt_stat, fmt_value
from fathom.stats.units import percent

UNIT = {"test_acc": "%", "test_ce": "nats"}
DIFF = {"test_acc": "pp", "test_ce": "nats"}


def _ms(stat: Mapping[str, Any] | None, unit: str) -> str:
    return fmt_stat(stat, unit)


def _num(x: float | None, fmt: str = "+.4f") -> str:
    return "—" if x is None else format(x, fmt)


def to_markdown(summary: Mapping[str, Any]) -> str:
    """Render :func:`summarise_study` output as markdown tables (mean ± sample SD)."""
    ref = summary["reference"]
    lines = [
        f"Reference recipe: **{ref}**. Values are mean ± sample SD over seeds (n stated).",
        "",
        "| Method | LR | Validation-selected accuracy (%) | Final accuracy (%) "
        "| Selected test CE (nats) | Final test CE (nats) | Flags |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in summary["recipes"].items():
        flags = sorted({f for fl in e["flags"].values() for f in fl})
        lr = ", ".join(f"{x:g}" for x in e["lr"]) or "—"
        lines.append(
            f"| {name} | {lr} | {_ms(e['selected']['test_acc'], '%')} "
            f"| {_ms(e['final']['test_acc'], '%')} "
            f"| {_ms(e['selected']['test_ce'], 'nats')} | {_ms(e['final']['test_ce'], 'nats')} "
            f"| {', '.join(flags) or '—'} |"
        )
    lines += [
        "",
        f"Paired differences (recipe − {ref}), each interval at the level of its Holm step:",
        "",
        "| Method | Metric | Checkpoint | Difference | Interval | Level | n | Region of no "
        "interest | Verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["comparisons"]:
        d, unit = c["diff"], DIFF[c["metric"]]
        interval = "—"
        if d is not None and d["low"] is not None:
            interval = f"[{fmt_value(d['low'], unit, signed=True)}, {fmt_value(d['high'], unit, signed=True)}]"
        verdict = f"{c['verdict']}, fragile" if c.get("fragile") else c["verdict"]
        lines.append(
            f"| {c['recipe']} | {c['metric']} ({c['unit']}) | {c['checkpoint']} "
            f"| {fmt_value(None if d is None else d['estimate'], unit, signed=True)} | {interval} "
            f"| {fmt_level(None if d is None else d['level'])} | {'—' if d is None else d['n']} "
            f"| ±{fmt_value(c['smallest_effect'], unit)} | {verdict} |"
        )
    lines += ["", *[f"- {c['sentence']}" for c in summary["comparisons"]]]
    lines += [
        "",
        "| Method | Fixed-horizon training (s) | Ratio to reference | Time to target, training (s) "
        "| Time to target, elapsed (s) | Reached |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in summary["recipes"].items():
        ratio = e["training_ratio_to_reference"]["ratio_of_means"]
        ttt = e.get("time_to_target")
        reached = f"{ttt['reached']}/{ttt['n']}" if ttt else "—"
        lines.append(
            f"| {name} | {_ms(e['training_s'], 's')} | {_num(ratio, '.3f')} "
            f"| {_ms(ttt['training_s'], 's') if ttt else '—'} "
            f"| {_ms(ttt['elapsed_s'], 's') if ttt else '—'} "
            f"| {reached} |"
        )
    lines += _rankings(summary)
    if summary["excluded"]:
        lines += ["", "Excluded runs (no comparison):", ""]
        lines += [
            f"- {x['recipe']} seed {x['seed']}: {', '.join(x['flags'])}"
            for x in summary["excluded"]
        ]
    lines += ["", *[f"_{n}_" for n in summary["notes"]], ""]
    return "\n".join(lines)


def _rankings(summary: Mapping[str, Any]) -> list[str]:
    """Per metric: the ranking statement (:mod:`fathom.stats.ranking`), the pairwise
    comparisons it rests on, and both rankings of the means side by side."""
    lines: list[str] = []
    for metric, rk in summary["rankings"].items():
        claim = rk.get("claim")
        if claim is None:
            continue
        unit = DIFF[metric]
        lines += ["", claim["sentence"], "", f"Pairwise differences by {rk['label']} (a − b):", ""]
        lines += ["| a | b | Checkpoint | Difference | Interval | Level | n | Verdict |"]
        lines += ["|---|---|---|---|---|---|---|---|"]
        for p in rk["pairs"]:
            d = p["diff"] or {}
            interval = "—"
            if d.get("low") is not None:
                interval = f"[{fmt_value(d['low'], unit, signed=True)}, {fmt_value(d['high'], unit, signed=True)}]"
            verdict = f"{p['verdict']}, fragile" if p.get("fragile") else p["verdict"]
            lines.append(
                f"| {p['a']} | {p['b']} | {p['checkpoint']} "
                f"| {fmt_value(d.get('estimate'), unit, signed=True)} | {interval} "
                f"| {fmt_level(d.get('level'))} | {d.get('n', '—')} | {verdict} |"
            )
        if not rk["disagree"]:
            continue
        lines += [
            "",
            f"Recipe means by {rk['label']} at each checkpoint:",
            "",
            "| Method | Selected | Rank | Final | Rank |",
            "|---|---|---|---|---|",
        ]
        conv = percent if rk["label"] == "test accuracy" else float
        lines += [
            f"| {r['name']} | {conv(r['selected']):.4f} | {r['selected_rank']} "
            f"| {conv(r['final']):.4f} | {r['final_rank']} |"
            for r in rk["rows"]
        ]
    return lines
