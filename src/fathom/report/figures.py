"""Static PNG figures (matplotlib, the ``plot`` extra): learning curves and mask damage.

Learning curves: one unsmoothed line per run (colour: cohort), validation accuracy and
CE against epoch and against the training clock; nulls and non-finite values are gaps.
Mask damage: every audit mask record (:func:`damage_records`), each damage value (per
split: ``val.damage``, ``test.damage``) against the mask's multiply-accumulates (only the
records that carry ``macs``, when any do), else against the record's position.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fathom.errors import FathomError, install_hint
from fathom.report.runs import RunData
from fathom.report.tables import flat

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
            f"`{install_hint('plot')}` (or pass --no-figures)"
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


def _damage_keys(rec: Mapping[str, Any]) -> list[str]:
    return [k for k, v in rec.items() if "damage" in k.rsplit(".", 1)[-1] and _is_number(v)]


def damage_records(obj: Any) -> list[dict[str, Any]]:
    """Mask records inside ``obj``, flattened (``{"val": {"damage": d}} -> val.damage``):
    mappings with a ``mask`` key and a numeric damage value (a key whose last part
    contains 'damage'); if there are none, every mapping with a damage value of its own."""
    masks: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []

    def walk(x: Any) -> None:
        if isinstance(x, Mapping):
            f = flat(x)
            if "mask" in x and _damage_keys(f):
                masks.append(f)
                return
            own = {k: v for k, v in x.items() if _is_number(v)}
            if _damage_keys(own):
                others.append(f)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(obj)
    return masks or others


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def mask_damage(audit: Mapping[str, Any], path: Path) -> Path | None:
    """Damage of each audited mask (see the module docstring); ``None`` without records."""
    recs = damage_records(audit)
    if not recs:
        return None
    plt = _pyplot()
    with_macs = [r for r in recs if "macs" in r]
    has_macs = bool(with_macs)
    recs = with_macs or recs
    keys = sorted({k for r in recs for k in _damage_keys(r)})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key in keys:
        rows = [r for r in recs if key in r]
        xs = [_num(r.get("macs")) for r in rows] if has_macs else list(range(len(rows)))
        ax.scatter(xs, [_num(r[key]) for r in rows], s=14, label=key)
    ax.legend(fontsize=8)
    ax.set_xlabel("multiply-accumulates per example" if has_macs else "audit record")
    ax.set_ylabel("damage")
    ax.set_title(f"Mask damage ({len(recs)} records from audit.json)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
