"""Fathom's counterparts of seed 002's telemetry tables, through the cross-run table code.

The study's runs are read once by :func:`fathom.report.runs.load_runs`; only main-phase runs
count (:func:`fathom.report.crossrun.by_recipe`). Every quantity is a field the telemetry
recorded (its one definition is in :mod:`fathom.telemetry.moments` and the registry); this
module only selects cells, with the cross-run table helpers.

``telemetry_layers`` (``base``, ``recipe``, ``over``, optional ``percent``): the layers L are
the ``<base>/<L>`` fields (:func:`~fathom.report.crossrun.layer_fields`). At the recipe's
last recorded epoch ``e`` (the earliest last epoch over its seeds, as
:func:`~fathom.report.crossrun.activation_table` takes it), each layer's cell is the spread
over seeds of ``v_s(L) = value_at(run_s, <base>/<L>, e)`` (:func:`~fathom.report.crossrun.spread`;
fractions to percent by :func:`fathom.stats.units.percent`). ``over = "min"`` / ``"max"``
picks the layer whose seed mean is smallest / largest -- the seed's "69–74% across its hidden
layers" is the range of its per-layer seed means -- and ``"head"`` the head layer
(:func:`~fathom.report.crossrun.head_layer`). Fathom's per-seed values are the chosen
layer's ``v_s(L)``, so the comparison's mean, range and interval are that cell's.

:func:`fathom_tables` gives the cross-run tables themselves (for a seed table whose numbers
the seed's text does not give: Fathom's side is printed whole).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.report.crossrun import (
    CrossTable,
    by_recipe,
    crossrun_tables,
    default_reference,
    field_names,
    head_layer,
    last_epoch,
    layer_fields,
    spread,
    value_at,
)
from fathom.reproduce.extract import Measured, Sources
from fathom.stats.units import percent


def _reference(src: Sources) -> str | None:
    return default_reference(src.run_data(), src.summary)


def layer_cells(
    src: Sources, base: str, recipe: str, as_percent: bool
) -> tuple[int | None, list[tuple[str, dict[int, float], dict[str, Any] | None]]]:
    """``(epoch, [(layer, {seed: v_s(L)}, spread)])`` of ``recipe`` at its last epoch."""
    runs = by_recipe(src.run_data(), _reference(src)).get(recipe, [])
    layers = layer_fields(field_names(runs), base)
    ends = (
        [e for e in (last_epoch(r, layers[0][1]) for r in runs) if e is not None] if layers else []
    )
    if not ends:
        return None, []
    e = min(ends)
    convert = percent if as_percent else float
    cells = []
    for layer, name in layers:
        per = {int(r.seed or 0): value_at(r, name, e) for r in runs}
        values = {s: float(convert(v)) for s, v in per.items() if v is not None}
        cells.append((layer, values, spread(list(per.values()), convert)))
    return e, cells


def telemetry_layers(src: Sources, ex: Mapping[str, Any]) -> Measured:
    """The chosen layer's per-seed values (see the module docstring)."""
    epoch, cells = layer_cells(src, ex["base"], ex["recipe"], bool(ex.get("percent", False)))
    cells = [c for c in cells if c[2] is not None]
    if not cells:
        return Measured(missing=f"no {ex['base']}/<layer> field in the {ex['recipe']} runs")
    over = ex["over"]
    if over == "head":
        head = head_layer([layer for layer, _, _ in cells])
        layer, values, _ = next(c for c in cells if c[0] == head)
        note = f"head layer {layer}, epoch {epoch}"
    else:
        pick = {"min": min, "max": max}[over]
        layer, values, _ = pick(cells, key=lambda c: c[2]["mean"])  # type: ignore[index]
        note = f"{over} over {len(cells)} layers of the seed mean: {layer}, epoch {epoch}"
    return Measured(values, note=note)


def fathom_tables(src: Sources) -> dict[str, CrossTable]:
    """Every cross-run table the study's runs support, by name (curvature tables left out)."""
    return {t.name: t for t in crossrun_tables(src.run_data(), _reference(src))}


TELEMETRY_EXTRACTORS = {"telemetry_layers": telemetry_layers}
