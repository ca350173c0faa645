"""The seeds' cross-run tables, computed from run directories (pure data, no rendering).

Every table is over a study's *main-phase* runs (tuning-grid runs are left out), grouped
by recipe with the reference recipe first. Per-layer telemetry fields are found through
their registry family prefix (``grad/pex/diversity/<layer>``), so both index names
(``L5``) and qualified module names (``blocks.0.res.branch``, ``head``) work; the head is
the layer named ``head`` if one is, else the last layer in recorded order.

Definitions (``v_s``: one value per seed s of a recipe, at the stated epoch):

* spread: ``mean = (1/n) Σ v_s``, sample SD (ddof 1, ``None`` for n < 2), ``min``, ``max``.
* per-digit differences: ``d_s = acc_c(recipe, s) - acc_c(reference, s)`` over seeds in
  both, at each run's final history row, in percentage points, with the paired 95%
  Student-t interval of :func:`fathom.stats.paired_difference`.
* accuracies and zero-activation fractions are converted to percent by
  :func:`fathom.stats.units.percent`; CE is in nats.

Curvature tables are in :mod:`fathom.report.curvtables`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fathom.report.runs import RunData, widest_first
from fathom.stats.intervals import mean_sd, paired_difference
from fathom.stats.units import percent

# Registry prefixes of the per-layer fields the tables read (the layer is the last segment).
GRAD_NORM = "grad/mean/weight_norm"
DIVERSITY = "grad/pex/diversity"
MAX_SHARE = "grad/pex/max_share"
PARTICIPATION = "grad/pex/participation"
ZERO_FRAC = "probe/act/zero_frac"
_INDEX = re.compile(r"^L(\d+)$")


@dataclass(frozen=True)
class Column:
    """``kind``: ``text`` | ``int`` | ``num`` (4 significant digits) | ``pct`` (percent, 2
    decimals) | ``pp`` (signed percentage points) | ``spread`` (a :func:`spread` dict) |
    ``ratio`` (``"19.2×"``)."""

    key: str
    label: str
    kind: str = "num"
    unit: str = ""


@dataclass
class CrossTable:
    name: str
    title: str
    note: str
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spread(
    values: Sequence[float | None], convert: Callable[[float], Any] = float
) -> dict[str, Any] | None:
    """Mean, sample SD, min, max and n of the finite values, each first passed through
    ``convert`` (``fathom.stats.units.percent`` for fractions shown in percent); None if none."""
    xs = [convert(float(v)) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return None
    mean, sd, n = mean_sd(xs)
    return {"mean": mean, "sd": sd, "min": min(xs), "max": max(xs), "n": n}


def main_runs(runs: Sequence[RunData]) -> list[RunData]:
    return [r for r in runs if r.phase is None]


def by_recipe(runs: Sequence[RunData], reference: str | None) -> dict[str, list[RunData]]:
    """Main runs per recipe, the reference first, then the recipes in sorted order."""
    out: dict[str, list[RunData]] = {}
    for r in sorted(main_runs(runs), key=lambda r: (r.recipe != reference, r.recipe, r.seed or 0)):
        out.setdefault(r.recipe, []).append(r)
    return out


def layer_fields(names: Sequence[str], base: str) -> list[tuple[str, str]]:
    """``(layer, field)`` for every ``base/<layer>`` in ``names`` (layer: one segment);
    index names sort numerically, module names keep their recorded order."""
    found = list(
        dict.fromkeys(
            (n[len(base) + 1 :], n)
            for n in names
            if n.startswith(base + "/") and "/" not in n[len(base) + 1 :]
        )
    )
    if found and all(_INDEX.match(layer) for layer, _ in found):
        found.sort(key=lambda p: int(_INDEX.match(p[0]).group(1)))  # type: ignore[union-attr]
    return found


def head_layer(layers: Sequence[str]) -> str | None:
    return "head" if "head" in layers else (layers[-1] if layers else None)


def field_names(runs: Sequence[RunData]) -> list[str]:
    """Every recorded field, first-seen order over the widest run first (layer order)."""
    return list(dict.fromkeys(k for r in widest_first(list(runs)) for row in r.rows for k in row))


def value_at(run: RunData, name: str, epoch: int) -> float | None:
    """The finite number ``name`` holds in the row of ``epoch``, else None."""
    for row in run.rows:
        if row["epoch"] == epoch:
            v = row.get(name)
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            return float(v) if ok else None
    return None


def recorded_epochs(runs: Sequence[RunData], name: str) -> list[int]:
    """Epochs at which any of ``runs`` has a row holding ``name``."""
    return sorted({row["epoch"] for r in runs for row in r.rows if name in row})


def last_epoch(run: RunData, name: str) -> int | None:
    eps = [row["epoch"] for row in run.rows if name in row]
    return max(eps) if eps else None


def gradient_table(
    runs: Sequence[RunData], reference: str | None, epochs: Sequence[int] | None = None
) -> CrossTable | None:
    """Fixed-probe head-layer gradient statistics per recipe and epoch (seed spreads)."""
    names = field_names(runs)
    layers = [layer for layer, _ in layer_fields(names, DIVERSITY)]
    head = head_layer(layers)
    if head is None:
        return None
    groups = by_recipe(runs, reference)
    cols = [
        Column("recipe", "recipe", "text"),
        Column("epoch", "epoch", "int"),
        Column("n", "seeds", "int"),
        Column("grad_norm", "‖mean g‖", "spread"),
        Column("diversity", "diversity D", "spread"),
        Column("max_share", "largest-example energy share", "spread"),
        Column("participation", "norm participation", "spread"),
    ]
    table = CrossTable(
        "gradients",
        f"Fixed-probe gradients of the head layer ({head})",
        "g_i: per-example weight gradient of the unaveraged CE on the fixed probe (bias "
        "excluded). ‖mean g‖ = ‖(1/N) Σ g_i‖; D = mean ‖g_i‖² / ‖mean g‖²; energy share = "
        "max ‖g_i‖² / Σ ‖g_i‖²; participation = (Σ ‖g_i‖)² / Σ ‖g_i‖². Cells: seed mean "
        "(min–max). D near N can mean one example dominates vanishing gradients.",
        cols,
    )
    fields = {
        k: f"{base}/{head}"
        for k, base in (
            ("grad_norm", GRAD_NORM),
            ("diversity", DIVERSITY),
            ("max_share", MAX_SHARE),
            ("participation", PARTICIPATION),
        )
    }
    for recipe, rs in groups.items():
        chosen = epochs if epochs is not None else recorded_epochs(rs, fields["diversity"])
        for e in chosen:
            row: dict[str, Any] = {"recipe": recipe, "epoch": e}
            for key, name in fields.items():
                row[key] = spread([value_at(r, name, e) for r in rs])
            row["n"] = max((row[k]["n"] for k in fields if row[k]), default=0)
            table.rows.append(row)
    return table


def activation_table(runs: Sequence[RunData], reference: str | None) -> CrossTable | None:
    """Zero post-ReLU activation fraction per hidden layer at each run's last recorded epoch.

    Recipes whose layers have different module names (a plain block is ``blocks.0.res``, a
    residual branch ``blocks.0.res.branch``) are aligned by position in the model; the
    column names every name found at that position."""
    groups = by_recipe(runs, reference)
    per = {recipe: layer_fields(field_names(rs), ZERO_FRAC) for recipe, rs in groups.items()}
    per = {k: v for k, v in per.items() if v}
    if not per:
        return None
    width = max(len(v) for v in per.values())
    labels = [
        " / ".join(dict.fromkeys(v[i][0] for v in per.values() if i < len(v))) for i in range(width)
    ]
    cols = [
        Column("recipe", "recipe", "text"),
        Column("epoch", "epoch", "int"),
        Column("n", "seeds", "int"),
    ]
    cols += [
        Column(f"layer:{i}", _act_label(label), "spread", "%") for i, label in enumerate(labels)
    ]
    table = CrossTable(
        "zero_activations",
        "Zero post-ReLU activations per hidden layer (last recorded epoch)",
        "#{h == 0} / (N × units) on the fixed probe, mean over the probe then over seeds "
        "(min–max over seeds), in percent; a column '→ X' is the ReLU output feeding layer X "
        "(layers aligned by position across recipes). A zero on this probe does not prove a "
        "permanently dead unit.",
        cols,
    )
    for recipe, layers in per.items():
        rs = groups[recipe]
        ends = [e for e in (last_epoch(r, layers[0][1]) for r in rs) if e is not None]
        if not ends:
            continue
        e = min(ends)
        row: dict[str, Any] = {"recipe": recipe, "epoch": e, "n": 0}
        for i, (_layer, name) in enumerate(layers):
            s = spread([value_at(r, name, e) for r in rs], percent)
            row[f"layer:{i}"] = s
            row["n"] = max(row["n"], s["n"] if s else 0)
        table.rows.append(row)
    return table


def _act_label(layer: str) -> str:
    """``L0 (%)`` for hidden-index names; ``→ head (%)`` for the input of a qualified layer."""
    return f"{layer} (%)" if all(_INDEX.match(x) for x in layer.split(" / ")) else f"→ {layer} (%)"


def _final_row(run: RunData) -> Mapping[str, Any]:
    return run.rows[-1] if run.rows else {}


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
            for k in _final_row(r)
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
    ref = {r.seed: _final_row(r) for r in groups[reference]}
    for recipe, rs in groups.items():
        if recipe == reference:
            continue
        own = {r.seed: _final_row(r) for r in rs}
        row: dict[str, Any] = {"recipe": recipe, "n": 0, "intervals": {}}
        for key, name in [(f"digit:{c}", f"split/{split}/class_acc/{c}") for c in classes] + [
            ("overall", f"{split}/acc")
        ]:
            a = {s: percent(v[name]) for s, v in own.items() if _finite(v.get(name))}
            b = {s: percent(v[name]) for s, v in ref.items() if _finite(v.get(name))}
            if not set(a) & set(b):
                row[key] = None
                continue
            iv = paired_difference(a, b)
            row[key] = iv.estimate
            row["intervals"][key] = iv.to_dict()
            row["n"] = max(row["n"], iv.n)
        table.rows.append(row)
    return table


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def fitting_table(runs: Sequence[RunData], reference: str | None) -> CrossTable | None:
    """Full fitting-set accuracy and CE at each run's final history row."""
    groups = by_recipe(runs, reference)
    if not any("fit/acc" in _final_row(r) for rs in groups.values() for r in rs):
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
        rows = [_final_row(r) for r in rs]
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


def crossrun_tables(
    runs: Sequence[RunData],
    reference: str | None,
    curvature: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[CrossTable]:
    """Every cross-run table the data support (empty tables are left out)."""
    from fathom.report.curvtables import curvature_tables

    tables = [
        fitting_table(runs, reference),
        digit_table(runs, reference),
        gradient_table(runs, reference),
        activation_table(runs, reference),
        *curvature_tables(runs, reference, curvature or {}),
    ]
    return [t for t in tables if t is not None and t.rows]


def default_reference(runs: Sequence[RunData], summary: Mapping[str, Any] | None) -> str | None:
    """The study's reference recipe (summary.json), else ``residual`` if run, else the first."""
    ref = ((summary or {}).get("stats") or summary or {}).get("reference")
    recipes = sorted({r.recipe for r in main_runs(runs)})
    if ref in recipes:
        return ref
    return "residual" if "residual" in recipes else (recipes[0] if recipes else None)
