"""One number formatter per unit: every rendered value of :mod:`fathom.stats` goes through here.

Units: ``%`` (accuracy, stored as a fraction and converted by the caller through
:func:`fathom.stats.units.percent`), ``pp`` (percentage points), ``nats``, ``ratio``
(printed ``1.05×``), ``s`` (seconds), ``""`` (a plain number). ``None`` or a non-finite
value prints ``—`` (undefined is never 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fathom.stats.results import Comparison
from fathom.stats.units import percent

_DIGITS = {"%": 2, "pp": 2, "nats": 4, "s": 1, "": 4}
_SUFFIX = {"%": "%", "pp": " pp", "nats": " nats", "s": " s", "": ""}


def fmt_value(x: float | None, unit: str, *, signed: bool = False) -> str:
    """``x`` in ``unit`` (``signed``: with its sign, for differences)."""
    if x is None or not math.isfinite(float(x)):
        return "—"
    if unit == "ratio":
        return f"{x:.3g}×"
    sign = "+" if signed else ""
    return f"{x:{sign}.{_DIGITS[unit]}f}{_SUFFIX[unit]}"


def fmt_mean_sd(mean: float | None, sd: float | None, n: int | None, unit: str) -> str:
    """``mean ± sd unit (n=N)`` (sample SD; no ``±`` when n < 2), or ``—``."""
    if mean is None:
        return "—"
    text = fmt_value(mean, unit)
    if sd is not None:
        bare = fmt_value(mean, "") if unit == "" else text.removesuffix(_SUFFIX.get(unit, ""))
        text = f"{bare} ± {fmt_value(sd, unit)}"
    return f"{text} (n={n})"


def _on_scale(c: Comparison, x: float | None, signed: bool) -> str:
    if c.quantity.scale == "log ratio":
        return fmt_value(None if x is None else math.exp(x), "ratio")
    return fmt_value(x, c.quantity.unit, signed=signed)


def fmt_estimate(c: Comparison) -> str:
    """The comparison's point estimate (a ratio for the log scale, else a signed difference)."""
    return _on_scale(c, c.estimate, True)


def fmt_interval(c: Comparison) -> str:
    """``[low, high]`` on the comparison's display scale, or ``—`` without an interval."""
    if c.low is None or c.high is None:
        return "—"
    return f"[{_on_scale(c, c.low, True)}, {_on_scale(c, c.high, True)}]"


def fmt_region(c: Comparison) -> str:
    """The region of no interest: ``±0.5 pp`` or ``[0.952×, 1.05×]``."""
    d = c.quantity.smallest_effect
    if c.quantity.scale == "log ratio":
        return f"[{fmt_value(math.exp(-d), 'ratio')}, {fmt_value(math.exp(d), 'ratio')}]"
    return f"±{fmt_value(d, c.quantity.unit)}"


def fmt_level(level: float | None) -> str:
    """An interval level as a percentage: ``95%``, ``99.69%``."""
    return "—" if level is None else f"{100 * level:.4g}%"


def fmt_stat(stat: Mapping[str, Any] | None, unit: str) -> str:
    """A summary stat ``{"mean", "sd", "n"}`` in ``unit`` (``%``: stored as a fraction)."""
    if not stat or stat.get("mean") is None:
        return "—"
    conv = percent if unit == "%" else float
    sd = None if stat.get("sd") is None else conv(stat["sd"])
    return fmt_mean_sd(conv(stat["mean"]), sd, stat.get("n"), unit)


def fmt_diff_row(row: Mapping[str, Any] | None) -> str:
    """A summary comparison row's difference and interval: ``+1.17 pp [+0.06 pp, +2.28 pp]``."""
    if not row or not row.get("diff"):
        return "—"
    d, unit = row["diff"], "pp" if row["metric"] == "test_acc" else "nats"
    text = fmt_value(d["estimate"], unit, signed=True)
    if d.get("low") is None:
        return f"{text} (n={d.get('n')})"
    return f"{text} [{fmt_value(d['low'], unit, signed=True)}, {fmt_value(d['high'], unit, signed=True)}]"
