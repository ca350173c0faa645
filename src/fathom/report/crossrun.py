"""The seeds' cross-run tables, gathered: :func:`crossrun_tables`, the study's reference
recipe and its one layer alignment.

Tables: :mod:`fathom.report.quality` (fitting, per digit), :mod:`fathom.report.telemetry_tables`
(fixed-probe gradients, zero activations, with computed contrasts) and
:mod:`fathom.report.curvtables`; their data types, shared helpers and definitions (spread,
failure flags, per-digit differences) are :mod:`fathom.report.crosstable`, below every table.
Layers of different recipes are matched by :mod:`fathom.report.layers` (position in the model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fathom.report.crosstable import CrossTable, main_runs
from fathom.report.curvtables import curvature_tables
from fathom.report.fields import recorded_layers
from fathom.report.layers import LayerAlignment, align_layers
from fathom.report.quality import digit_table, fitting_table
from fathom.report.runs import RunData
from fathom.report.telemetry_tables import activation_table, gradient_table


def crossrun_tables(
    runs: Sequence[RunData],
    reference: str | None,
    curvature: Mapping[str, Mapping[str, Any]] | None = None,
    alignment: LayerAlignment | None = None,
) -> list[CrossTable]:
    """Every cross-run table the data support (empty tables are left out); per-layer
    tables align layers by ``alignment`` (default: :func:`fathom.report.layers.align_layers`
    of the runs, reference recipe first)."""
    if alignment is None:
        alignment = study_alignment(runs, reference)
    tables = [
        fitting_table(runs, reference),
        digit_table(runs, reference),
        gradient_table(runs, reference, alignment),
        activation_table(runs, reference, alignment),
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


def study_alignment(runs: Sequence[RunData], reference: str | None) -> LayerAlignment:
    """The one layer alignment of a study's report: every run, the reference recipe's
    runs first (their names lead the labels), main before tuning; names recorded in a
    history but not in the manifest's layer list are matched by name."""
    ordered = sorted(runs, key=lambda r: (r.recipe != reference, r.phase is not None))
    return align_layers(ordered, {r.run_id: recorded_layers(r) for r in ordered})
