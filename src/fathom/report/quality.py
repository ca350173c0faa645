"""Quality cross-run tables: per-digit accuracy differences and full fitting-set scores.

Definitions in :mod:`fathom.report.crosstable`; per-digit differences use the paired 95%
Student-t interval of :func:`fathom.stats.paired_difference`, in percentage points.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fathom.report.crosstable import Column, CrossTable, by_recipe, final_row, finite, spread
from fathom.report.runs import RunData
from fathom.stats.intervals import paired_difference
from fathom.units import percent


def digit_table(
    runs: Sequence[RunData], reference: str | None, split: str = "test"
) -> CrossTable | None:
    """Per-digit accuracy differences against the reference recipe at the final row."""
    groups = by_recipe(runs, reference)
    if reference not in groups or len(groups) < 2:
        return None
    classes = sorted(
        {
            int(k.rsplit("/", 1)[1])
            for r in groups[reference]
            for k in final_row(r)
            if k.startswith(f"split/{split}/class_acc/")
        }
    )
    if not classes:
        return None
    cols = [Column("recipe", "recipe", "text"), Column("n", "paired seeds", "int")]
    cols += [Column(f"digit:{c}", f"{c}", "pp", "pp") for c in classes]
    cols.append(Column("overall", "overall", "pp", "pp"))
    table = CrossTable(
        f"digits_{split}",
        f"Per-digit {split} accuracy difference from {reference} (final checkpoint, pp)",
        f"Every digit, no best/worst selection: mean over paired seeds of "
        f"acc_c(recipe) − acc_c({reference}), in percentage points; paired 95% t intervals "
        "are in summary.json. Classes have different counts, so the mean of the ten cells "
        "need not equal the overall difference. Descriptive, no multiple-comparison correction.",
        cols,
    )
    ref = {r.seed: final_row(r) for r in groups[reference]}
    for recipe, rs in groups.items():
        if recipe == reference:
            continue
        own = {r.seed: final_row(r) for r in rs}
        row: dict[str, Any] = {"recipe": recipe, "n": 0, "intervals": {}}
        for key, name in [(f"digit:{c}", f"split/{split}/class_acc/{c}") for c in classes] + [
            ("overall", f"{split}/acc")
        ]:
            a = {s: percent(v[name]) for s, v in own.items() if finite(v.get(name))}
            b = {s: percent(v[name]) for s, v in ref.items() if finite(v.get(name))}
            if not set(a) & set(b):
                row[key] = None
                continue
            iv = paired_difference(a, b)
            row[key] = iv.estimate
            row["intervals"][key] = iv.to_dict()
            row["n"] = max(row["n"], iv.n)
        table.rows.append(row)
    return table


def fitting_table(runs: Sequence[RunData], reference: str | None) -> CrossTable | None:
    """Full fitting-set accuracy and CE at each run's final history row."""
    groups = by_recipe(runs, reference)
    if not any("fit/acc" in final_row(r) for rs in groups.values() for r in rs):
        return None
    table = CrossTable(
        "fitting",
        "Full fitting-set accuracy and CE at the final checkpoint",
        "Dense evaluation of the whole fitting split at each run's last epoch; cells are "
        "seed mean (min–max); accuracy in percent, CE in nats. Near-complete fitting does "
        "not by itself say a recipe prevents overfitting.",
        [
            Column("recipe", "recipe", "text"),
            Column("epoch", "epoch", "int"),
            Column("n", "seeds", "int"),
            Column("fit_acc", "fitting accuracy (%)", "spread", "%"),
            Column("fit_ce", "fitting CE (nats)", "spread", "nats"),
            Column("at_100", "seeds at 100%", "int"),
        ],
    )
    for recipe, rs in groups.items():
        rows = [final_row(r) for r in rs]
        acc = spread([v.get("fit/acc") for v in rows], percent)
        table.rows.append(
            {
                "recipe": recipe,
                "epoch": max((v.get("epoch", 0) for v in rows), default=None),
                "n": acc["n"] if acc else 0,
                "fit_acc": acc,
                "fit_ce": spread([v.get("fit/ce") for v in rows]),
                "at_100": sum(1 for v in rows if v.get("fit/acc") == 1.0),
            }
        )
    return table
