"""Each seed number beside Fathom's: the difference and whether it lies in Fathom's spread.

For one seed value ``v`` (units of the seed) and Fathom's per-seed values ``x_1..x_n`` of
the same quantity (:mod:`fathom.reproduce.extract`):

* ``fathom = mean_i x_i``, ``sd`` the sample standard deviation, ``range = [min x, max x]``,
  ``interval`` the 95% Student-t interval of the mean (:func:`fathom.stats.t_interval`);
* ``difference = fathom - v`` (same units; percentage points for percentages);
* ``within_spread``: ``min x <= v <= max x`` -- the seed's number is one Fathom's own seeds
  produced or bracket -- defined only for ``n >= 2`` (a single run has no spread).

The verdict says which of these applies, and never claims a digit-for-digit match: the
seeds' runs drew other initial parameters and splits. A scaled-down study (its
``scale_down`` list is not empty) is *not comparable in magnitude* and is labelled so; so is
a clock measured on other hardware than the seed's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

from fathom.reproduce.extract import EXTRACTORS, Measured, Sources, fathom_tables
from fathom.reproduce.head import head_collapse
from fathom.reproduce.seeds import SeedData, SeedValue
from fathom.stats import t_interval

_FORMAT = 1
_KIND = "fathom.reproduce.comparison"


def spread(values: dict[int, float]) -> dict[str, Any]:
    """Mean, sample SD, range and 95% t interval of the per-seed values (``n >= 1``)."""
    xs = [values[s] for s in sorted(values)]
    out: dict[str, Any] = {
        "n": len(xs),
        "mean": statistics.fmean(xs),
        "sd": statistics.stdev(xs) if len(xs) > 1 else None,
        "min": min(xs),
        "max": max(xs),
        "interval": None,
    }
    if len(xs) > 1:
        ci = t_interval(xs, 0.95)
        out["interval"] = [ci.low, ci.high]
    return out


def verdict(
    seed: SeedValue,
    m: Measured,
    stats: dict[str, Any] | None,
    comparable: str | None,
    value: float | None = None,
) -> tuple[str, bool | None]:
    """``(sentence, within_spread)`` for one row (``within_spread`` None when undefined);
    ``value`` is the seed's number on Fathom's scale (a rate for a count), ``seed.value``
    by default."""
    if m.missing is not None or stats is None:
        return f"no Fathom counterpart here: {m.missing}", None
    v = float(seed.number if value is None else value)
    within = stats["min"] <= v <= stats["max"] if stats["n"] > 1 else None
    if seed.not_comparable is not None:
        return f"not comparable (another definition): {seed.not_comparable}", within
    if comparable is not None:
        return f"not comparable in magnitude: {comparable}", within
    if seed.hardware is not None:
        return f"not comparable: measured on other hardware (seed: {seed.hardware})", within
    if within is None:
        return "one run: no seed-to-seed spread (difference shown, not judged)", None
    if within:
        return "within Fathom's seed-to-seed range", True
    side = "above" if v > stats["max"] else "below"
    return f"outside Fathom's seed-to-seed range (seed value {side} it)", False


def seed_epoch(seed: SeedValue, data: SeedData) -> int | str | None:
    """The seed's epoch of a value: its snapshot epoch, ``"selected"`` for the
    validation-selected checkpoint, else the epoch its table's protocol ended at (for a
    whole-run quantity such as a clock, the run's length; ``None`` for a table without
    one)."""
    if "epoch" in seed.extract:
        return int(seed.extract["epoch"])
    if seed.extract.get("checkpoint") == "selected":
        return "selected"
    if seed.kind == "none":
        return None
    return next((t.epochs for t in data.table if t.id == seed.table), None)


def rates(seed: SeedValue, m: Measured) -> tuple[float, dict[int, float]] | None:
    """``(seed rate, {seed: Fathom rate})`` in percent for a count with a denominator on both
    sides (``100 · correct / total``, each over its own total); ``None`` otherwise."""
    if seed.denominator is None or m.missing is not None or set(m.totals) != set(m.values):
        return None
    own = {s: 100.0 * m.values[s] / m.totals[s] for s in m.values if m.totals[s] > 0}
    return 100.0 * seed.number / seed.denominator, own


def compare_row(
    seed: SeedValue,
    data: SeedData,
    src: Any,
    comparable: str | None,
    extractors: Mapping[str, Callable[[Any, Mapping[str, Any]], Measured]] = EXTRACTORS,
) -> dict:
    """One row of the comparison (JSON-able); ``extractors[seed.kind](src, extract)`` gives
    Fathom's per-seed values (a study's :class:`Sources` by default). A count with its
    denominator (``seed.denominator``) is compared as a rate: ``fathom``, ``difference`` and
    ``within_spread`` are then of ``100 · correct / total``, each side over its own total."""
    m = extractors[seed.kind](src, seed.extract)
    rated = rates(seed, m)
    ref = None if isinstance(seed.value, tuple) else float(seed.value)
    per_seed = m.values
    if rated is not None:
        ref, per_seed = rated
    stats = spread(per_seed) if m.missing is None and per_seed else None
    sentence, within = verdict(seed, m, stats, comparable, ref)
    value = list(seed.value) if isinstance(seed.value, tuple) else seed.value
    diff = None if stats is None or ref is None else stats["mean"] - ref
    inside_ci = None
    if stats is not None and stats["interval"] is not None and ref is not None:
        lo, hi = stats["interval"]
        inside_ci = bool(lo <= ref <= hi)
    return {
        "id": seed.id,
        "table": seed.table,
        "quantity": seed.quantity,
        "source": data.source(seed),
        "quote": seed.quote,
        "units": seed.units,
        "statistic": seed.statistic,
        "seed_value": value,
        "seed_interval": list(seed.interval) if seed.interval else None,
        "seed_denominator": seed.denominator,
        "seed_rate": None if rated is None else ref,
        "seed_epoch": seed_epoch(seed, data),
        "fathom": stats,
        "fathom_per_seed": {str(k): v for k, v in sorted(per_seed.items())},
        "fathom_counts": (
            None
            if rated is None
            else {str(k): [m.values[k], m.totals[k]] for k in sorted(m.values)}
        ),
        "fathom_epochs": {str(k): v for k, v in sorted(m.epochs.items())},
        "fathom_note": m.note,
        "difference": diff,
        "within_spread": within,
        "seed_value_in_fathom_interval": inside_ci,
        "comparable": comparable is None and seed.hardware is None and not seed.not_comparable,
        "not_comparable": seed.not_comparable,
        "verdict": sentence,
    }


def final_epochs(data: SeedData, rows: list[dict[str, Any]]) -> list[int]:
    """The epochs of Fathom's final checkpoints, over the rows read at one: what a whole
    cross-run table "at the final checkpoint" (the seed's epoch 100) holds."""
    final = {v.id for v in data.value if v.extract.get("checkpoint") == "final"}
    return sorted({e for r in rows if r["id"] in final for e in r["fathom_epochs"].values()})


def reductions(summary: dict[str, Any]) -> list[str]:
    """What the study reduced from the full protocol (smaller network, data, epochs, seeds):
    the ``reduced`` items of ``summary["scaled_down"]`` and the study's own ``scale_down``
    notes. Other *changes* (frozen learning rates instead of tuning, say) do not change
    magnitudes and are not counted here."""
    if "scaled_down" in summary:
        reduced = [d["text"] for d in summary["scaled_down"] if d["kind"] == "reduced"]
        # the study's own scale-down notes count too: without a named protocol they are the
        # only statement of what was reduced
        return reduced + [n for n in summary.get("scale_down_notes") or [] if n not in reduced]
    return list(summary.get("scale_down") or [])


def comparison(
    data: SeedData, src: Sources, *, pipeline: str, locations: dict[str, str]
) -> dict[str, Any]:
    """Every seed value beside Fathom's (``reproduction.json``'s contents)."""
    scale_down = reductions(src.summary)
    comparable = "scaled-down run (see scale_down)" if scale_down else None
    tables = data.tables_of("study")
    ids = {t.id for t in tables}
    rows = [compare_row(v, data, src, comparable) for v in data.value if v.table in ids]
    return {
        "format": _FORMAT,
        "kind": _KIND,
        "pipeline": pipeline,
        "study": src.summary.get("study"),
        "devices": src.summary.get("devices", []),
        "scale_down": scale_down,
        "comparable_in_magnitude": comparable is None,
        "definitions": {
            "difference": "Fathom mean minus seed value, in the seed value's units",
            "within_spread": "min <= seed value <= max over Fathom's per-seed values (n >= 2 only)",
            "interval": "95% Student-t interval of Fathom's mean over seeds",
        },
        "caveat": (
            "Fathom's runs draw other initial parameters and other fitting/validation splits "
            "than the seeds' runs: numbers are compared with Fathom's seed-to-seed spread, "
            "never digit for digit."
        ),
        "tables": [
            {
                "id": t.id,
                "title": t.title,
                "source": data.source(t),
                "counterpart": locations.get(t.id, t.counterpart),
                "seed_epochs": t.epochs,
                **_whole_table(t.fathom_table, src),
            }
            for t in tables
        ],
        "rows": rows,
        "final_epochs": final_epochs(data, rows),
        "head_collapse": head_collapse(
            src.head, [v for v in data.value if v.kind == "head" and v.denominator is not None]
        ),
    }


def _whole_table(name: str | None, src: Sources) -> dict[str, Any]:
    """Fathom's cross-run table ``name`` (its dict and markdown), for a seed table whose
    numbers the seed's text does not give; empty when ``name`` is None."""
    if name is None:
        return {}
    from fathom.report.render import table_markdown

    table = fathom_tables(src).get(name)
    if table is None:
        return {
            "fathom_table": None,
            "fathom_table_md": f"(no cross-run table {name!r}: its fields were not recorded)",
        }
    return {"fathom_table": table.to_dict(), "fathom_table_md": table_markdown(table)}
