"""Fathom's counterparts of seed 002's telemetry tables, through the cross-run table code.

The study's runs are read once by :func:`fathom.report.runs.load_runs`; only main-phase runs
count (:func:`fathom.report.crosstable.by_recipe`), and layers are matched across recipes by the
report's alignment (:func:`fathom.report.crossrun.study_alignment`,
:func:`fathom.report.telemetry_tables.aligned_fields`). Every quantity is a field the telemetry
recorded (its one definition is in :mod:`fathom.telemetry.moments` and the registry); this
module only selects cells, with the cross-run table helpers.

``telemetry_layers`` (``base``, ``recipe``, ``over``, optional ``percent``): the layers L are
the aligned ``<base>/<L>`` fields. At the recipe's last recorded epoch ``e`` (the earliest
last epoch over its runs and layers, as
:func:`~fathom.report.telemetry_tables.activation_table` takes it), each layer's cell is the
spread over seeds of ``v_s(L) = value_at(run_s, <base>/<L>, e)`` (:func:`~fathom.report.crosstable.spread`;
fractions to percent by :func:`fathom.base.units.percent`). ``over = "min"`` / ``"max"``
picks the layer whose seed mean is smallest / largest -- the seed's "69–74% across its hidden
layers" is the range of its per-layer seed means -- and ``"head"`` the head layer
(as the report's gradient table picks it). Fathom's per-seed values are the chosen
layer's ``v_s(L)``, so the comparison's mean, range and interval are that cell's.

:func:`fathom_tables` gives the cross-run tables themselves (for a seed table whose numbers
the seed's text does not give: Fathom's side is printed whole).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.base.units import percent
from fathom.report.crossrun import crossrun_tables, default_reference, study_alignment
from fathom.report.crosstable import CrossTable, by_recipe, last_epoch, spread
from fathom.report.telemetry_tables import _head, _per_seed, aligned_fields
from fathom.reproduce.extract import Measured, Sources


def _reference(src: Sources) -> str | None:
    return default_reference(src.run_data(), src.summary)


def _layer_cells(
    src: Sources, base: str, recipe: str, as_percent: bool
) -> tuple[int | None, list[tuple[str, dict[int, float], dict[str, Any] | None]]]:
    """``(epoch, [(layer, {seed: v_s(L)}, spread)])`` of ``recipe`` at its last epoch, the
    layers aligned across recipes as the report aligns them."""
    runs, ref = src.run_data(), _reference(src)
    groups = by_recipe(runs, ref)
    rs = groups.get(recipe, [])
    main = [r for g in groups.values() for r in g]
    fields = aligned_fields(main, base, study_alignment(runs, ref))
    ends = [last_epoch(r, f) for lab in fields for r in rs if (f := fields[lab].get(r.run_id))]
    ends = [e for e in ends if e is not None]
    if not ends:
        return None, []
    e = min(ends)
    convert = percent if as_percent else float
    cells = []
    for lab, per_run in fields.items():
        raw = _per_seed(rs, per_run, e)
        values = {s: float(convert(v)) for s, v in raw.items()}
        cells.append((lab, values, spread(list(raw.values()), convert)))
    return e, cells


def telemetry_layers(src: Sources, ex: Mapping[str, Any]) -> Measured:
    """The chosen layer's per-seed values (see the module docstring)."""
    epoch, cells = _layer_cells(src, ex["base"], ex["recipe"], bool(ex.get("percent", False)))
    cells = [c for c in cells if c[2] is not None]
    if not cells:
        return Measured(missing=f"no {ex['base']}/<layer> field in the {ex['recipe']} runs")
    over = ex["over"]
    if over == "head":
        head = _head({layer: {} for layer, _, _ in cells})
        layer, values, _ = next(c for c in cells if c[0] == head)
        note = f"head layer {layer}, epoch {epoch}"
    else:
        pick = {"min": min, "max": max}[over]
        layer, values, _ = pick(cells, key=lambda c: c[2]["mean"])  # type: ignore[index]
        note = f"{over} over {len(cells)} layers of the seed mean: {layer}, epoch {epoch}"
    epochs = {} if epoch is None else {seed: epoch for seed in values}
    return Measured(values, note=note, epochs=epochs)


def fathom_tables(src: Sources) -> dict[str, CrossTable]:
    """Every cross-run table the study's runs support, by name (curvature tables left out)."""
    return {t.name: t for t in crossrun_tables(src.run_data(), _reference(src))}


TELEMETRY_EXTRACTORS = {"telemetry_layers": telemetry_layers}
