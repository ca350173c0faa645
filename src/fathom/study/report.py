"""Print a study summary (``summary.json`` contents) as rich tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from fathom.study.runner import integrity_markdown, scale_down_text


def _ms(stat: dict[str, Any] | None, scale: float = 1.0, digits: int = 4) -> str:
    if not stat or stat.get("mean") is None:
        return "—"
    text = f"{scale * stat['mean']:.{digits}f}"
    if stat.get("sd") is not None:
        text += f" ± {scale * stat['sd']:.{digits}f}"
    return f"{text} (n={stat['n']})"


def _opt(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """The tables of ``summary.md``, for the terminal."""
    console = console or Console()
    stats = summary["stats"]
    ref = stats["reference"]
    console.rule(f"Study {summary['study']}")
    console.print(scale_down_text(summary))
    console.print(f"Device(s): {', '.join(summary['devices'])}")
    for line in integrity_markdown(summary):
        if line:
            console.print(line, overflow="fold")

    t = summary["tuning"]
    if t["enabled"]:
        grid = Table(title=f"Tuning grid (seed {t['seed']}), selected by minimum validation CE")
        for col in (
            "Method",
            "LR",
            "Status",
            "Min val CE",
            "Epoch",
            "Diverged in epoch",
            "Selected",
        ):
            grid.add_column(col)
        for p in t["grid"]:
            grid.add_row(
                p["recipe"],
                f"{p['lr']:g}",
                p["status"],
                _opt(p["val_ce"], ".4f"),
                _opt(p["selected_epoch"], "d"),
                _opt(p["diverged_epoch"], "d"),
                "✓" if t["selected_lr"].get(p["recipe"]) == p["lr"] else "",
            )
        console.print(grid)

    quality = Table(
        title=f"Test quality, mean ± sample SD over seeds (accuracy in %); reference {ref}"
    )
    for col in (
        "Method",
        "LR",
        "Validation-selected accuracy",
        "Final accuracy",
        "Final test CE",
        "Flags",
    ):
        quality.add_column(col)
    for name, e in stats["recipes"].items():
        flags = sorted({f for fl in e["flags"].values() for f in fl})
        quality.add_row(
            name,
            ", ".join(f"{x:g}" for x in e["lr"]) or "—",
            _ms(e["selected"]["test_acc"], 100, 3),
            _ms(e["final"]["test_acc"], 100, 3),
            _ms(e["final"]["test_ce"]),
            ", ".join(flags) or "—",
        )
    console.print(quality)

    pct = f"{100 * stats['level']:g}%"
    diffs = Table(title=f"Paired differences (method − {ref}) with {pct} t intervals")
    for col in ("Method", "Metric", "Checkpoint", "Difference", "Interval", "n", "Verdict"):
        diffs.add_column(col)
    for c in stats["comparisons"]:
        d = c["diff"]
        interval = "—" if d is None or d["low"] is None else f"[{d['low']:+.4f}, {d['high']:+.4f}]"
        diffs.add_row(
            c["recipe"],
            f"{c['metric']} ({c.get('unit', '')})",
            c["checkpoint"],
            _opt(None if d is None else d["estimate"], "+.4f"),
            interval,
            "—" if d is None else str(d["n"]),
            c["verdict"],
        )
    console.print(diffs)

    timing = Table(title="Training time (fixed horizon) and time to target")
    for col in (
        "Method",
        "Training clock (s)",
        "Ratio to reference",
        "To target, training (s)",
        "To target, elapsed (s)",
        "Reached",
    ):
        timing.add_column(col)
    for name, e in stats["recipes"].items():
        ttt = e.get("time_to_target")
        timing.add_row(
            name,
            _ms(e["training_s"], 1, 2),
            _opt(e["training_ratio_to_reference"]["ratio_of_means"], ".3f"),
            _ms(ttt["training_s"], 1, 2) if ttt else "—",
            _ms(ttt["elapsed_s"], 1, 2) if ttt else "—",
            f"{ttt['reached']}/{ttt['n']}" if ttt else "—",
        )
    console.print(timing)

    for rk in stats["rankings"].values():
        if rk["disagree"]:
            table = Table(
                title=f"Ranking by {rk['label']} disagrees between selected and final checkpoints"
            )
            for col in ("Method", "Selected", "Rank", "Final", "Rank"):
                table.add_column(col)
            for r in rk["rows"]:
                table.add_row(
                    r["name"],
                    f"{r['selected']:.4f}",
                    str(r["selected_rank"]),
                    f"{r['final']:.4f}",
                    str(r["final_rank"]),
                )
            console.print(table)
    console.print("[bold]Verdicts[/bold]")
    for c in stats["comparisons"]:
        console.print(f"- {c['sentence']}")
    for x in stats["excluded"]:
        console.print(f"- excluded: {x['recipe']} seed {x['seed']} ({', '.join(x['flags'])})")
    for n in stats["notes"]:
        console.print(f"[dim]{n}[/dim]")
    console.print(f"[dim]{scale_down_text(summary)}[/dim]")
