"""Markdown rendering of a study summary (:func:`fathom.stats.summary.summarise_study`).

Values are mean ± sample SD over seeds (n stated); accuracy (fractions in the summary)
in percent through :func:`fathom.stats.units.percent`, differences in percentage points,
CE in nats.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.stats.sentences_repro import ranking_claim
from fathom.stats.units import percent


def _ms(stat: Mapping[str, Any] | None, digits: int = 4) -> str:
    if stat is None or stat.get("mean") is None:
        return "—"
    text = f"{stat['mean']:.{digits}f}"
    if stat.get("sd") is not None:
        text += f" ± {stat['sd']:.{digits}f}"
    return f"{text} (n={stat['n']})"


def _ms_pct(stat: Mapping[str, Any] | None) -> str:
    """An accuracy stat (fractions) as ``"92.36 ± 0.76 % (n=3)"`` via :func:`percent`."""
    if stat is None or stat.get("mean") is None:
        return "—"
    text = f"{percent(stat['mean']):.2f}"
    if stat.get("sd") is not None:
        text += f" ± {percent(stat['sd']):.2f}"
    return f"{text} % (n={stat['n']})"


def _num(x: float | None, fmt: str = "+.4f") -> str:
    return "—" if x is None else format(x, fmt)


def to_markdown(summary: Mapping[str, Any]) -> str:
    """Render :func:`summarise_study` output as markdown tables (mean ± sample SD)."""
    ref = summary["reference"]
    pct = f"{100 * summary['level']:g}%"
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
            f"| {name} | {lr} | {_ms_pct(e['selected']['test_acc'])} "
            f"| {_ms_pct(e['final']['test_acc'])} "
            f"| {_ms(e['selected']['test_ce'])} | {_ms(e['final']['test_ce'])} "
            f"| {', '.join(flags) or '—'} |"
        )
    lines += [
        "",
        f"Paired differences (recipe − {ref}) with {pct} t intervals:",
        "",
        "| Method | Metric | Checkpoint | Difference | Interval | n | Verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in summary["comparisons"]:
        d = c["diff"]
        interval = "—" if d is None or d["low"] is None else f"[{d['low']:+.4f}, {d['high']:+.4f}]"
        lines.append(
            f"| {c['recipe']} | {c['metric']} ({c['unit']}) | {c['checkpoint']} "
            f"| {_num(None if d is None else d['estimate'])} | {interval} "
            f"| {'—' if d is None else d['n']} | {c['verdict']} |"
        )
    shown = [c for c in summary["comparisons"] if c["verdict"] not in ("not established",)]
    lines += ["", *[f"- {c['sentence']}" for c in shown]]
    rest = len(summary["comparisons"]) - len(shown)
    if rest:
        lines.append(f"- {rest} other comparison(s): not established (see the Verdict column).")
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
            f"| {name} | {_ms(e['training_s'], 1)} | {_num(ratio, '.3f')} "
            f"| {_ms(ttt['training_s'], 1) if ttt else '—'} "
            f"| {_ms(ttt['elapsed_s'], 1) if ttt else '—'} "
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
    """Per metric whose recipe means reorder: the ranking sentence
    (:func:`fathom.stats.sentences_repro.ranking_claim`) and both rankings side by side."""
    lines: list[str] = []
    for metric, rk in summary["rankings"].items():
        claim = ranking_claim(rk, summary.get("comparisons") or [], metric)
        if claim["sentence"] is None:
            continue
        lines += [
            "",
            claim["sentence"],
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
