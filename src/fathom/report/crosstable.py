"""The data types and helpers of the seeds' cross-run tables (pure data, no rendering).

The tables that use them are :mod:`fathom.report.quality` (fitting, per digit),
:mod:`fathom.report.telemetry_tables` (fixed-probe gradients, zero activations, with computed
contrasts) and :mod:`fathom.report.curvtables`; :func:`fathom.report.crossrun.crossrun_tables`
gathers them. This module sits below all of them, so no table imports its gatherer.

Every table is over a study's *main-phase* runs (tuning-grid runs are left out), grouped
by recipe with the reference recipe first (:func:`by_recipe`). Per-layer telemetry fields
are found through their registry family prefix (``grad/pex/diversity/<layer>``,
:func:`layer_fields`), so both index names (``L5``) and qualified module names
(``blocks.0.res.branch``, ``head``) work.

Definitions (``v_s``: one value per seed s of a recipe, at the stated epoch):

* spread: ``mean = (1/n) Σ v_s``, sample SD (ddof 1, ``None`` for n < 2), ``min``, ``max``.
* failure flags of a run: :func:`fathom.stats.failure_flags` of its status and final row.
* per-digit differences: ``d_s = acc_c(recipe, s) - acc_c(reference, s)`` over seeds in
  both, at each run's final history row, in percentage points, with the paired 95%
  Student-t interval of :func:`fathom.stats.paired_difference`.
* accuracies and zero-activation fractions are converted to percent by
  :func:`fathom.base.units.percent`; CE is in nats.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fathom.report.runs import RunData, widest_first
from fathom.stats.flags import failure_flags
from fathom.stats.intervals import mean_sd

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
    verdicts: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spread(
    values: Sequence[float | None], convert: Callable[[float], Any] = float
) -> dict[str, Any] | None:
    """Mean, sample SD, min, max and n of the finite values, each first passed through
    ``convert`` (``fathom.base.units.percent`` for fractions shown in percent); None if none."""
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


def seed_values(runs: Sequence[RunData], fields: Mapping[str, str], epoch: int) -> dict[int, float]:
    """``seed -> v_s``: each run's own field (``fields[run_id]``, the name the layer has in
    that run) at ``epoch`` (:func:`value_at`; finite values only, runs without a seed left out)."""
    out = {}
    for r in runs:
        v = value_at(r, fields[r.run_id], epoch) if r.run_id in fields else None
        if v is not None and r.seed is not None:
            out[r.seed] = v
    return out


def recorded_epochs(runs: Sequence[RunData], name: str) -> list[int]:
    """Epochs at which any of ``runs`` has a row holding ``name``."""
    return sorted({row["epoch"] for r in runs for row in r.rows if name in row})


def last_epoch(run: RunData, name: str) -> int | None:
    eps = [row["epoch"] for row in run.rows if name in row]
    return max(eps) if eps else None


def final_row(run: RunData) -> Mapping[str, Any]:
    return run.rows[-1] if run.rows else {}


def finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _run_flags(run: RunData) -> list[str]:
    """:func:`fathom.stats.failure_flags` of a run from its manifest status and final row
    (test accuracy, fitting CE and accuracy); classes from the manifest's ``data.info``,
    else the number of per-class test accuracies. Without a class count (< 2) only the
    status, non-finite and fitting flags apply; a status other than the five known ones
    counts as ``running`` (no final result)."""
    last = final_row(run)
    m = run.recorded
    classes = m.data.info.classes or sum(k.startswith("split/test/class_acc/") for k in last)
    status = m.status
    known = ("complete", "diverged", "failed", "running", "interrupted")
    values = {k: _flag_value(last.get(k)) for k in ("test/acc", "fit/ce", "fit/acc")}
    chance = int(classes) >= 2
    return failure_flags(
        status=status if status in known else "running",
        test_acc=values["test/acc"] if chance else None,
        train_ce=values["fit/ce"] if chance else None,
        classes=int(classes) if chance else 2,
        n_eval=(m.data.sizes or {}).get("test"),
        fit_acc=values["fit/acc"],
    )


def _flag_value(v: Any) -> float | None:
    """A final value for the flags: the number, NaN for a non-finite float, else None."""
    if finite(v):
        return float(v)
    return float("nan") if isinstance(v, float) else None


def recipe_flags(runs: Sequence[RunData]) -> list[str]:
    """The union of the runs' failure flags (one arm's flags for a comparison)."""
    return sorted({f for r in runs for f in _run_flags(r)})
