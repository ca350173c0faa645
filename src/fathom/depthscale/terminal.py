"""The depth-scaling results for an 80-column terminal (``table.md`` keeps the full table).

Two tables instead of the log's eleven columns: accuracy per depth with each arm's cell
state (trained / failed / partial) and the difference, then gradient health; the failures,
the two computed answers (level across depths, scaling with depth), the sentence they rest
on and the conditioning notes follow as wrapped lines. Accuracy is in
percent, its difference in percentage points.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from fathom.base.terminal import table
from fathom.depthscale.table import BASELINE, CANDIDATE, ResultsTable


def _f(v: float | None, spec: str, scale: float = 1.0) -> str:
    return "—" if v is None else format(scale * v, spec)


def _accuracy_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        cells = r["cells"]
        out.append(
            [
                str(r["depth"]),
                str(r["seeds"]),
                _f(r["vanilla_acc"], ".2f", 100),
                cells.get(BASELINE, "—"),
                _f(r["lyapunov_acc"], ".2f", 100),
                cells.get(CANDIDATE, "—"),
                _f(r["delta_acc"], "+.2f", 100),
            ]
        )
    return out


def _health_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            str(r["depth"]),
            _f(r["vanilla_lambda"], ".3f"),
            _f(r["lyapunov_lambda"], ".3f"),
            _f(r["vanilla_grad_norm"], ".2e"),
            _f(r["lyapunov_grad_norm"], ".2e"),
            _f(r["vanilla_kappa"], ".1e"),
            _f(r["lyapunov_kappa"], ".1e"),
        ]
        for r in rows
    ]


def print_results(results: ResultsTable, note: str = "", console: Console | None = None) -> None:
    """Accuracy and health tables, failures, the verdict, conditioning notes."""
    console = console or Console()
    title = f"Depth scaling: {results.dataset} ({results.classes} classes)"
    if note:
        console.print(note)
    acc_cols = ["Depth", "Seeds", "Vanilla acc (%)", "Vanilla", "Lyap. acc (%)", "Lyapunov"]
    acc_cols.append("Δ acc (pp)")
    console.print(
        table(
            f"{title}: test accuracy at the validation-selected epoch, mean over seeds",
            acc_cols,
            _accuracy_rows(results.rows),
            right=["Depth", "Seeds", "Vanilla acc (%)", "Lyap. acc (%)", "Δ acc (pp)"],
        )
    )
    health_cols = ["Depth", "Van. λ̂", "Lyap. λ̂", "Van. ∇norm", "Lyap. ∇norm", "Van. κ", "Lyap. κ"]
    console.print(
        table(
            "Gradient health (λ̂ health-probe Lyapunov exponent; κ median Jacobian condition)",
            health_cols,
            _health_rows(results.rows),
            right=health_cols,
        )
    )
    failures = [
        f"depth {r['depth']}: {'; '.join(r['failures'])}" for r in results.rows if r["failures"]
    ]
    if failures:
        console.print("[bold]Runs with failure flags[/bold]")
        for f in failures:
            console.print(f"- {f}")
    v = results.verdict
    for line in v.answer_lines(CANDIDATE, BASELINE):
        question, answer = line.split(": ", 1)
        console.print(f"[bold]{escape(question)}[/bold]: {escape(answer)}", highlight=False)
    console.print(f"[bold]Verdict[/bold]: {escape(v.sentence)}", highlight=False)
    for o in v.observations:
        console.print(f"- {escape(o)}")
    for c in results.conditioning:
        console.print(f"- {c}")
