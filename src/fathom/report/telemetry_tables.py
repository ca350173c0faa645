"""Fixed-probe telemetry across seeds: the head-layer gradient table, zero activations per
hidden layer, and their computed contrasts against the reference recipe.

Layers of different recipes are matched by :class:`fathom.report.layers.LayerAlignment`
(position in the model), so plain's ``blocks.0.res`` and residual's ``blocks.0.res.branch``
share a column. Each contrast is :func:`fathom.stats.contrasts.contrast` of the per-seed
values of a recipe against the reference's at one epoch, with both arms' failure flags
(:func:`fathom.report.crosstable.recipe_flags`):

* gradients, at every epoch both recipes recorded: ``‖mean g‖``, diversity D and norm
  participation on the ``ratio`` scale (geometric-mean ratio), the largest-example energy
  share on the ``difference`` scale (percentage points);
* zero-activation fractions, per aligned layer, at the earlier of the two recipes' last
  recorded epochs, on the ``difference`` scale (pp).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fathom.base.units import percent
from fathom.report.crosstable import (
    Column,
    CrossTable,
    by_recipe,
    field_names,
    last_epoch,
    layer_fields,
    recipe_flags,
    recorded_epochs,
    seed_values,
    spread,
)
from fathom.report.layers import LayerAlignment, output_label
from fathom.report.runs import RunData
from fathom.stats.contrasts import contrast, contrast_sentence, judge_contrast_rows

# Registry prefixes of the per-layer fields the tables read (the layer is the last segment).
_GRAD_NORM = "grad/mean/weight_norm"
_DIVERSITY = "grad/pex/diversity"
_MAX_SHARE = "grad/pex/max_share"
_PARTICIPATION = "grad/pex/participation"
_ZERO_FRAC = "probe/act/zero_frac"
# (table key, field prefix, label, contrast scale)
GRADIENT_QUANTITIES = (
    ("grad_norm", _GRAD_NORM, "‖mean g‖ (nats / param. unit)", "ratio"),
    ("diversity", _DIVERSITY, "diversity D", "ratio"),
    ("max_share", _MAX_SHARE, "largest-example energy share (%)", "difference"),
    ("participation", _PARTICIPATION, "norm participation", "ratio"),
)


def aligned_fields(
    runs: Sequence[RunData], base: str, alignment: LayerAlignment
) -> dict[str, dict[str, str]]:
    """``label -> {run_id: field}`` for every aligned layer some run records ``base/<layer>``
    for, in the alignment's (model) order."""
    found: dict[str, dict[str, str]] = {}
    for r in runs:
        for layer, name in layer_fields(field_names([r]), base):
            found.setdefault(alignment.label(r.run_id, layer), {})[r.run_id] = name
    order = {lab: i for i, lab in enumerate(alignment.labels)}
    return dict(sorted(found.items(), key=lambda kv: order.get(kv[0], len(order))))


def _contrast_row(
    recipe: str,
    reference: str,
    groups: dict[str, list[RunData]],
    fields: dict[str, str],
    epoch: int,
    *,
    scale: str,
    quantity: str,
    key: str,
    layer: str,
) -> dict[str, Any]:
    c = contrast(
        seed_values(groups[recipe], fields, epoch),
        seed_values(groups[reference], fields, epoch),
        scale=scale,
        flags_a=recipe_flags(groups[recipe]),
        flags_b=recipe_flags(groups[reference]),
        name_a=recipe,
        name_b=reference,
    )
    return {
        "recipe": recipe,
        "reference": reference,
        "epoch": epoch,
        "quantity": key,
        "label": quantity,
        "layer": layer,
        **c.to_dict(),
        "sentence": contrast_sentence(
            c, name_a=recipe, name_b=reference, quantity=quantity, epoch=epoch
        ),
    }


def _epochs(runs: Sequence[RunData], fields: dict[str, str]) -> list[int]:
    """Epochs at which any of ``runs`` has a row holding its own field."""
    return sorted(
        {e for r in runs if r.run_id in fields for e in recorded_epochs([r], fields[r.run_id])}
    )


def gradient_table(
    runs: Sequence[RunData], reference: str | None, alignment: LayerAlignment
) -> CrossTable | None:
    """Fixed-probe head-layer gradient statistics per recipe and epoch (seed spreads), and
    their contrasts against ``reference`` at every epoch both recorded."""
    groups = by_recipe(runs, reference)
    main = [r for rs in groups.values() for r in rs]
    per_q = {key: aligned_fields(main, base, alignment) for key, base, _, _ in GRADIENT_QUANTITIES}
    head = output_label(list(per_q["diversity"]))
    if head is None:
        return None
    fields = {key: per_q[key].get(head, {}) for key in per_q}
    table = CrossTable(
        "gradients",
        f"Fixed-probe gradients of the head layer ({head})",
        "g_i: per-example weight gradient of the unaveraged CE on the fixed probe (bias "
        "excluded). ‖mean g‖ = ‖(1/N) Σ g_i‖; D = mean ‖g_i‖² / ‖mean g‖²; energy share = "
        "max ‖g_i‖² / Σ ‖g_i‖²; participation = (Σ ‖g_i‖)² / Σ ‖g_i‖². Cells: seed mean "
        "(min–max); the energy share in percent. D near N can mean one example dominates "
        "vanishing gradients. Contrasts: "
        "geometric-mean ratio recipe / reference over paired seeds (energy share: difference "
        "in pp) with its interval, resolution floor and region of no interest, Holm-corrected over "
        "the table's contrasts (docs/statistics.md).",
        [
            Column("recipe", "recipe", "text"),
            Column("epoch", "epoch", "int"),
            Column("n", "seeds", "int"),
            *(
                Column(key, label, "spread", "%" if scale == "difference" else "")
                for key, _, label, scale in GRADIENT_QUANTITIES
            ),
        ],
    )
    epochs = {recipe: _epochs(rs, fields["diversity"]) for recipe, rs in groups.items()}
    for recipe, rs in groups.items():
        for e in epochs[recipe]:
            row: dict[str, Any] = {"recipe": recipe, "epoch": e}
            for key, _, _, scale in GRADIENT_QUANTITIES:
                pct = percent if scale == "difference" else float  # fractions in %
                row[key] = spread(list(seed_values(rs, fields[key], e).values()), pct)
            row["n"] = max((row[k]["n"] for k in fields if row[k]), default=0)
            table.rows.append(row)
    if reference in groups:
        for recipe in groups:
            common = [e for e in epochs[recipe] if e in epochs[reference]]
            if recipe == reference:
                continue
            for e in common:
                for key, _, label, scale in GRADIENT_QUANTITIES:
                    table.verdicts.append(
                        _contrast_row(recipe, reference, groups, fields[key], e, scale=scale,
                                      quantity=f"head-layer {label.split(' (')[0]}",
                                      key=key, layer=head)
                    )  # fmt: skip
    table.verdicts[:] = judge_contrast_rows(table.verdicts, table.name)
    return table


def nonlinearity(runs: Sequence[RunData]) -> str:
    """The runs' hidden nonlinearity, named by their model kind's row
    (:attr:`fathom.config.model_kinds.ModelKind.nonlinearity`): ``"GELU"`` for a ``gpt``,
    ``"ReLU"`` for the Ciresan MLP; several, joined with ``" / "`` in the runs' order."""
    from fathom.config.model_kinds import recorded_model

    names: list[str] = []
    for r in runs:
        recorded = recorded_model(r.recorded.config.model.as_json())
        name = recorded[0].nonlinearity(recorded[1]) if recorded else None
        name = name or "nonlinearity"
        if name not in names:
            names.append(name)
    return " / ".join(names) or "ReLU"


def activation_table(
    runs: Sequence[RunData], reference: str | None, alignment: LayerAlignment
) -> CrossTable | None:
    """Zero activation fraction (after the model's nonlinearity, :func:`nonlinearity`) per
    hidden layer at each recipe's last recorded epoch (layers aligned by position), and the
    contrasts against ``reference``."""
    groups = by_recipe(runs, reference)
    fields = aligned_fields([r for rs in groups.values() for r in rs], _ZERO_FRAC, alignment)
    if not fields:
        return None
    labels = list(fields)
    act = nonlinearity([r for rs in groups.values() for r in rs])
    table = CrossTable(
        "zero_activations",
        f"Zero post-{act} activations per hidden layer (last recorded epoch)",
        "#{h == 0} / (N × units) on the fixed probe, mean over the probe then over seeds "
        f"(min–max over seeds), in percent; a column '→ X' is the {act} output feeding layer X "
        "(the same network layer of every recipe, matched by position in the model). A zero "
        "on this probe does not prove a permanently dead unit. Contrasts: difference recipe − "
        "reference in pp over paired seeds, Holm-corrected over the table's contrasts "
        "(docs/statistics.md), at the earlier last epoch.",
        [
            Column("recipe", "recipe", "text"),
            Column("epoch", "epoch", "int"),
            Column("n", "seeds", "int"),
            *(Column(f"layer:{i}", _act_label(lab), "spread", "%") for i, lab in enumerate(labels)),
        ],
    )
    ends: dict[str, int] = {}
    for recipe, rs in groups.items():
        last = [last_epoch(r, f) for lab in labels for r in rs if (f := fields[lab].get(r.run_id))]
        if not [e for e in last if e is not None]:
            continue
        e = ends[recipe] = min(e for e in last if e is not None)
        row: dict[str, Any] = {"recipe": recipe, "epoch": e, "n": 0}
        for i, lab in enumerate(labels):
            s = spread(list(seed_values(rs, fields[lab], e).values()), percent)
            row[f"layer:{i}"] = s
            row["n"] = max(row["n"], s["n"] if s else 0)
        table.rows.append(row)
    if reference in ends:
        for recipe, e in ends.items():
            if recipe == reference:
                continue
            for lab in labels:
                table.verdicts.append(
                    _contrast_row(recipe, reference, groups, fields[lab], min(e, ends[reference]),
                                  scale="difference", quantity=f"zero-activation fraction into {lab}",
                                  key="zero_frac", layer=lab)
                )  # fmt: skip
    table.verdicts[:] = judge_contrast_rows(table.verdicts, table.name)
    return table


def _act_label(layer: str) -> str:
    """``L0 (%)`` for hidden-index names; ``→ head (%)`` for the input of a qualified layer."""
    return f"{layer} (%)" if all(_is_index(x) for x in layer.split(" / ")) else f"→ {layer} (%)"


def _is_index(name: str) -> bool:
    return name[:1] == "L" and name[1:].isdigit()
