"""Static PNG figures (matplotlib, the ``plot`` extra), one colour per recipe throughout.

* ``learning_curves.png``: main-phase runs; per recipe the seed mean (line) and the
  min–max band over seeds of validation accuracy (%) and CE (nats), and of the ``[loss]``
  table's validation loss (``val/loss``) where the runs recorded it, against epoch and
  the training clock (s at each epoch, mean over seeds). Nulls and non-finite values
  are gaps. Legend outside the axes.
* ``mask_damage.png``: one panel per (arm, checkpoint) of the audit: every mask's test
  damage ΔCE (nats) against its cost (MACs as a fraction of the dense network), one
  point per seed and the seed mean per mask.

Colours come from :func:`recipe_colours` (Okabe-Ito, colour-blind safe), the same as the page's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fathom.base.units import percent
from fathom.errors import FathomError, install_hint
from fathom.report.fields import is_accuracy
from fathom.report.runs import RunData

_PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
"""Okabe-Ito: eight colours told apart with any colour vision."""


def recipe_colours(recipes: Iterable[str]) -> dict[str, str]:
    """``recipe -> colour``: the palette in sorted recipe order, so a recipe keeps its colour
    in every figure of one report and in report.html (and across reports of studies with the
    same recipes)."""
    return {r: _PALETTE[i % len(_PALETTE)] for i, r in enumerate(sorted(set(recipes)))}


_CURVES = (("val/acc", "validation accuracy (%)"), ("val/ce", "validation CE (nats)"))
_LOSS_CURVE = ("val/loss", "validation loss (the runs' [loss])")
"""Drawn under :data:`_CURVES` where a run recorded it (a run with a ``[loss]`` table)."""
_X_AXES = (("epoch", "epoch"), ("clock/training_s", "training clock (s)"))


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files, no display), or a :class:`FathomError`
    naming the ``plot`` extra when matplotlib is not installed."""
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


def _seed_curves(
    runs: Sequence[RunData], field: str, xfield: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per epoch: mean x, and mean, min, max of ``field`` over the runs (NaN where none)."""
    convert = percent if is_accuracy(field) else float
    epochs = sorted({row["epoch"] for r in runs for row in r.rows if field in row})
    xs, mean, lo, hi = [], [], [], []
    for e in epochs:
        rows = [row for r in runs for row in r.rows if row["epoch"] == e and field in row]
        x = [v for v in (_num(row.get(xfield)) for row in rows) if math.isfinite(v)]
        y = [convert(v) for v in (_num(row.get(field)) for row in rows) if math.isfinite(v)]
        xs.append(sum(x) / len(x) if x else math.nan)
        mean.append(sum(y) / len(y) if y else math.nan)
        lo.append(min(y) if y else math.nan)
        hi.append(max(y) if y else math.nan)
    return xs, mean, lo, hi


def learning_curves(runs: Sequence[RunData], path: Path) -> Path | None:
    """Validation accuracy and CE per recipe; ``None`` when no main run recorded them."""
    main = [r for r in runs if r.phase is None] or list(runs)
    curves = _CURVES + (
        (_LOSS_CURVE,) if any(_LOSS_CURVE[0] in w for r in main for w in r.rows) else ()
    )
    if not any(f in row for r in main for row in r.rows for f, _ in curves):
        return None
    plt = pyplot()
    colours = recipe_colours(r.recipe for r in runs)
    recipes = sorted({r.recipe for r in main})
    size = (11, 6.5 * len(curves) / len(_CURVES))
    fig, axes = plt.subplots(len(curves), len(_X_AXES), figsize=size, squeeze=False)
    for i, (field, ylabel) in enumerate(curves):
        for j, (xfield, xlabel) in enumerate(_X_AXES):
            ax = axes[i][j]
            for recipe in recipes:
                rs = [r for r in main if r.recipe == recipe]
                xs, mean, lo, hi = _seed_curves(rs, field, xfield)
                ax.plot(xs, mean, marker=".", lw=1.6, ms=4, color=colours[recipe])
                if len(rs) > 1:
                    ax.fill_between(xs, lo, hi, color=colours[recipe], alpha=0.18, lw=0)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    handles = [
        plt.Line2D(
            [], [], color=colours[r], lw=2, label=f"{r} (n={sum(x.recipe == r for x in main)})"
        )
        for r in recipes
    ]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle("Validation curves: seed mean (line) and min–max over seeds (band); no smoothing")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def mask_damage(
    audit: Mapping[str, Any], path: Path, colours: Mapping[str, str] | None = None
) -> Path | None:
    """Per (arm, checkpoint) panel: test damage (nats) against MAC fraction, per seed.
    ``colours``: the study's recipe colours (:func:`recipe_colours` over every recipe run),
    so an arm has the colour its recipe has in the other figures."""
    cells: dict[tuple[str, str], list[tuple[int, list[dict[str, Any]]]]] = {}
    for run in audit.get("runs") or []:
        for which, rec in (run.get("checkpoints") or {}).items():
            masks = [
                m
                for m in (rec.get("masks") or [] if isinstance(rec, Mapping) else [])
                if isinstance(m, Mapping)
                and isinstance(m.get("test"), Mapping)
                and "damage" in m["test"]
            ]
            if masks:
                arm = str(run.get("arm", run.get("recipe", "?")))
                cells.setdefault((arm, which), []).append((run.get("seed"), masks))
    if not cells:
        return None
    plt = pyplot()
    arms = sorted({a for a, _ in cells})
    checkpoints = [c for c in ("selected", "final") if any(w == c for _, w in cells)]
    checkpoints += sorted({w for _, w in cells} - set(checkpoints))
    colours = {**recipe_colours(arms), **(colours or {})}
    fig, axes = plt.subplots(
        len(arms), len(checkpoints), figsize=(4.2 * len(checkpoints), 2.9 * len(arms)),
        squeeze=False, sharex=True, sharey=True,
    )  # fmt: skip
    for i, arm in enumerate(arms):
        for j, which in enumerate(checkpoints):
            ax = axes[i][j]
            per_mask: dict[str, list[tuple[float, float]]] = {}
            for _seed, masks in cells.get((arm, which), []):
                for m in masks:
                    per_mask.setdefault(m["mask"], []).append(
                        (_num(m.get("macs_fraction")), _num(m["test"]["damage"]))
                    )
            pts = [p for ps in per_mask.values() for p in ps]
            ax.scatter(
                [p[0] for p in pts], [p[1] for p in pts], s=9, alpha=0.45, color=colours[arm]
            )
            means = [(ps[0][0], sum(p[1] for p in ps) / len(ps)) for ps in per_mask.values()]
            ax.scatter(
                [m[0] for m in means],
                [m[1] for m in means],
                s=26,
                marker="D",
                color=colours[arm],
                edgecolor="k",
                lw=0.4,
            )
            ax.set_title(f"{arm}, {which} checkpoint", fontsize=10)
            ax.grid(alpha=0.3)
            if i == len(arms) - 1:
                ax.set_xlabel("MACs / example (fraction of dense)")
            if j == 0:
                ax.set_ylabel("test damage ΔCE (nats)")
    fig.legend(
        handles=[
            plt.Line2D([], [], ls="", marker="o", color="grey", alpha=0.5, label="one seed"),
            plt.Line2D([], [], ls="", marker="D", color="grey", markeredgecolor="k", label="seed mean per mask"),
        ],
        loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
    )  # fmt: skip
    fig.suptitle("Layer-removal damage: increase of test CE over the full model, every mask")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def all_figures(runs: Sequence[RunData], audit: Mapping[str, Any] | None, out: Path) -> list[Path]:
    made = [learning_curves(runs, out / "learning_curves.png")]
    if audit:
        colours = recipe_colours(r.recipe for r in runs)
        made.append(mask_damage(audit, out / "mask_damage.png", colours))
    return [p for p in made if p is not None]
