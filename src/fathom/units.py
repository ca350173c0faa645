"""The one unit convention for rendered accuracy: percent, differences in percentage points.

Stored values (``history.jsonl``, ``RunRecord``, the audit's per-mask records) keep
accuracy as a fraction in ``[0, 1]``; every rendering (study summary, audit, report,
cross-run tables, figures) converts through :func:`percent` and states the unit.

    percent(f)     = 100 f                      (unit "%")
    points(a - b)  = 100 (a - b)                (unit "pp", percentage points)
"""

from __future__ import annotations

import math

ACCURACY_UNIT = "%"
DIFFERENCE_UNIT = "pp"
ACCURACY_LABEL = "accuracy (%)"


def percent(fraction: float | None) -> float | None:
    """``100 * fraction``; ``None`` stays ``None`` (undefined is never 0)."""
    return None if fraction is None else 100.0 * float(fraction)


def fmt_percent(fraction: float | None, digits: int = 2) -> str:
    """A fraction as ``"98.63%"``; ``"—"`` when undefined or non-finite."""
    p = percent(fraction)
    if p is None or not math.isfinite(p):
        return "—"
    return f"{p:.{digits}f}%"


def fmt_points(fraction_diff: float | None, digits: int = 2) -> str:
    """A difference of fractions as signed percentage points, ``"-0.57 pp"``."""
    p = percent(fraction_diff)
    if p is None or not math.isfinite(p):
        return "—"
    return f"{p:+.{digits}f} pp"
