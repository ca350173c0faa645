"""The unit convention, under the name the analyses use: defined once in :mod:`fathom.base.units`
(the foundation layer, so the trainer's messages use it too)."""

from fathom.base.units import (
    ACCURACY_LABEL,
    ACCURACY_UNIT,
    DIFFERENCE_UNIT,
    fmt_percent,
    fmt_points,
    percent,
)

__all__ = [
    "ACCURACY_LABEL",
    "ACCURACY_UNIT",
    "DIFFERENCE_UNIT",
    "fmt_percent",
    "fmt_points",
    "percent",
]
