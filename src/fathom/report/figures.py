"""Static PNG figures (matplotlib, the ``plot`` extra): learning curves and mask damage.

Learning curves: one unsmoothed line per run (colour: cohort), validation accuracy and
CE against epoch and against the training clock; nulls and non-finite values are gaps.
Mask damage: every audit record that carries a ``damage`` value (any key containing
"damage"), against its multiply-accumulates when the record has a ``macs`` key, else
against its position in the audit's list.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fathom.errors import FathomError
from fathom.report.runs import RunData

CURVES = (("val/acc", "validation accuracy"), ("val/ce", "validation CE (nats)"))
X_AXES = (("epoch", "epoch"), ("clock/training_s", "training clock (s)"))


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FathomError(
            "static figures need matplotlib, which is not installed; install the extra with "
            "`pip install 'fathom[plot]'` (or pass --no-figures)"
        ) from None
    return plt


def _num(v: Any) -> float:
    """A plottable float; None and non-numbers become NaN, which matplotlib draws as a gap."""
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        return math.nan
    return float(v) if math.isfinite(float(v)) else math.nan


def learning_curves(runs: Sequence[RunData], path: Path) -> Path | None:
    """Validation accuracy and CE per run; ``None`` when no run recorded them."""
    if not any(r.rows and any(f in row for row in r.rows for f, _ in CURVES) for r in runs):
        return None
    plt = _pyplot()
    cohorts = sorted({r.cohort for r in runs})
    colors = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(cohorts)}
    fig, axes = plt.subplots(len(CURVES), len(X_AXES), figsize=(11, 7), squeeze=False)
    for i, (field, ylabel) in enumerate(CURVES):
        for j, (xfield, xlabel) in enumerate(X_AXES):
            ax = axes[i][j]
            for r in runs:
                rows = [row for row in r.rows if field in row]
                xs = [_num(row.get(xfield)) for row in rows]
                ys = [_num(row.get(field)) for row in rows]
                ax.plot(xs, ys, marker=".", lw=1, ms=3, color=colors[r.cohort])
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    for c in cohorts:
        axes[0][0].plot([], [], color=colors[c], label=c)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Learning curves: one unsmoothed line per run (seed); gaps are missing values")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def damage_records(obj: Any) -> list[Mapping[str, Any]]:
    """Every mapping inside ``obj`` that has a numeric value under a key containing 'damage'."""
    found: list[Mapping[str, Any]] = []
    if isinstance(obj, Mapping):
        if any("damage" in str(k) and isinstance(v, int | float) for k, v in obj.items()):
            found.append(obj)
        for v in obj.values():
            found += damage_records(v)
    elif isinstance(obj, list):
        for v in obj:
            found += damage_records(v)
    return found


def mask_damage(audit: Mapping[str, Any], path: Path) -> Path | None:
    """Damage of each audited mask (see the module docstring); ``None`` without records."""
    recs = damage_records(audit)
    if not recs:
        return None
    plt = _pyplot()
    key = next(k for k in recs[0] if "damage" in str(k))
    ys = [_num(r.get(key)) for r in recs]
    has_macs = all("macs" in r for r in recs)
    xs = [_num(r.get("macs")) for r in recs] if has_macs else list(range(len(recs)))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(xs, ys, s=14)
    ax.set_xlabel("multiply-accumulates per example" if has_macs else "audit record")
    ax.set_ylabel(key)
    ax.set_title(f"Mask damage ({len(recs)} records from audit.json)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
