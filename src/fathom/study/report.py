"""Print a study summary (``summary.json`` contents) as tables that fit 80 columns.

Accuracy is in percent, its differences in percentage points (pp), cross-entropy in nats.
Recipe names, statuses and verdict words are never wrapped or cut
(:mod:`fathom.terminal`); the paired differences are one table per checkpoint so that
each row fits.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from fathom.study.markdown import integrity_markdown, scale_down_text
from fathom.terminal import table

METRIC_SHORT = {"test_acc": "accuracy", "test_ce": "CE"}
UNIT_SHORT = {"percentage points": "pp", "nats": "nats"}
DIFF_DIGITS = {"test_acc": 2, "test_ce": 4}


def _ms(
    stat: dict[str, Any] | None, scale: float = 1.0, digits: int = 4, n: int | None = None
) -> str:
    """``mean ± sd``; ``(n=k)`` is added when ``k`` differs from the table's ``n``."""
    if not stat or stat.get("mean") is None:
        return "—"
    text = f"{scale * stat['mean']:.{digits}f}"
    if stat.get("sd") is not None:
        text += f" ± {scale * stat['sd']:.{digits}f}"
    return text if stat["n"] == n else f"{text} (n={stat['n']})"


def _opt(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def _seeds(e: dict[str, Any]) -> int | None:
    """Seeds behind a recipe's cells (those of its selected test accuracy)."""
    stat = e["selected"].get("test_acc")
    return None if not stat else stat["n"]


def _tuning(summary: dict[str, Any]):
    t = summary["tuning"]
    rows = [
        [
            p["recipe"],
            f"{p['lr']:g}",
            p["status"],
            _opt(p["val_ce"], ".4f"),
            _opt(p["selected_epoch"], "d"),
            _opt(p["diverged_epoch"], "d"),
            "✓" if t["selected_lr"].get(p["recipe"]) == p["lr"] else "",
        ]
        for p in t["grid"]
    ]
    cols = ["Method", "LR", "Status", "Min val\nCE", "At\nepoch", "Diverged\nin epoch", "Selected"]
    return table(
        f"Tuning grid (seed {t['seed']}), selected by minimum validation CE",
        cols,
        rows,
    )


def _rates(summary: dict[str, Any]):
    """Each recipe's rate and its source, for a study without a tuning phase."""
    t = summary["tuning"]
    sources = t.get("lr_source") or {}
    rows = [[r, f"{lr:g}", sources.get(r, "study.lr")] for r, lr in t["selected_lr"].items()]
    return table(f"No tuning phase: {t['rule']}", ["Method", "LR", "Source"], rows)


def _quality(stats: dict[str, Any]):
    rows = []
    for name, e in stats["recipes"].items():
        flags = sorted({f for fl in e["flags"].values() for f in fl})
        k = _seeds(e)
        rows.append(
            [
                name,
                ", ".join(f"{x:g}" for x in e["lr"]) or "—",
                "—" if k is None else str(k),
                _ms(e["selected"]["test_acc"], 100, 2, k),
                _ms(e["final"]["test_acc"], 100, 2, k),
                _ms(e["final"]["test_ce"], 1, 4, k),
                ", ".join(flags) or "—",
            ]
        )
    return table(
        f"Test quality, mean ± sample SD over n seeds; reference {stats['reference']}",
        ["Method", "LR", "n", "Selected\nacc (%)", "Final\nacc (%)", "Final CE\n(nats)", "Flags"],
        rows,
        wrap=["Flags"],
    )


def _differences(stats: dict[str, Any], checkpoint: str):
    pct = f"{100 * stats['level']:g}%"
    rows = []
    for c in stats["comparisons"]:
        if c["checkpoint"] != checkpoint:
            continue
        d, k = c["diff"], DIFF_DIGITS.get(c["metric"], 4)
        if d is None or d["low"] is None:
            interval = "—"
        else:
            interval = f"[{d['low']:+.{k}f}, {d['high']:+.{k}f}]"
        unit = UNIT_SHORT.get(c.get("unit", ""), c.get("unit", ""))
        rows.append(
            [
                c["recipe"],
                f"{METRIC_SHORT.get(c['metric'], c['metric'])} ({unit})",
                _opt(None if d is None else d["estimate"], f"+.{k}f"),
                interval,
                "—" if d is None else str(d["n"]),
                c["verdict"],
            ]
        )
    return table(
        f"Paired differences (method − {stats['reference']}), {checkpoint} checkpoint, "
        f"intervals at their Holm-step levels over n paired seeds (nominal {pct})",
        ["Method", "Metric", "Difference", "Holm interval", "n", "Verdict"],
        rows,
    )


def _timing(stats: dict[str, Any]):
    rows = []
    for name, e in stats["recipes"].items():
        ttt = e.get("time_to_target")
        n = _seeds(e)
        rows.append(
            [
                name,
                "—" if n is None else str(n),
                _ms(e["training_s"], 1, 2, n),
                _opt(e["training_ratio_to_reference"]["ratio_of_means"], ".3f"),
                _ms(ttt["training_s"], 1, 2, n) if ttt else "—",
                _ms(ttt["elapsed_s"], 1, 2, n) if ttt else "—",
                f"{ttt['reached']}/{ttt['n']}" if ttt else "—",
            ]
        )
    cols = [
        "Method",
        "n",
        "Training\nclock (s)",
        "Ratio\nto ref.",
        "To target,\ntraining (s)",
        "To target,\nelapsed (s)",
        "Reached",
    ]
    return table("Training time (fixed horizon) and time to target", cols, rows)


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
    if summary["tuning"]["enabled"]:
        console.print(_tuning(summary))
    else:
        console.print(_rates(summary))
    console.print(_quality(stats))
    for checkpoint in ("selected", "final"):
        console.print(_differences(stats, checkpoint))
    console.print(_timing(stats))
    for rk in stats["rankings"].values():
        claim = rk.get("claim")
        if claim is not None:
            console.print(claim["sentence"], overflow="fold")
            rows = [
                [
                    r["name"],
                    f"{r['selected']:.4f}",
                    r["selected_rank"],
                    f"{r['final']:.4f}",
                    r["final_rank"],
                ]
                for r in rk["rows"]
            ]
            console.print(
                table(
                    f"Recipe means by {rk['label']} at the selected and final checkpoints",
                    ["Method", "Selected", "Rank", "Final", "Rank "],
                    rows,
                )
            )
    console.print("[bold]Verdicts[/bold]")
    for c in stats["comparisons"]:
        console.print(f"- {c['sentence']}")
    for x in stats["excluded"]:
        console.print(f"- excluded: {x['recipe']} seed {x['seed']} ({', '.join(x['flags'])})")
    for note in stats["notes"]:
        console.print(f"[dim]{note}[/dim]")
