"""The one unit convention and the one number formatter per unit.

Stored values (``history.jsonl``, ``RunRecord``, the audit's per-mask records) keep
accuracy as a fraction in ``[0, 1]``; every rendering (terminal, study summary, audit,
report, cross-run tables, figures) converts through :func:`percent` and prints through
:func:`fmt_value` (or a wrapper here), which writes each unit's rounding rule once:

    percent(f)     = 100 f                       (unit "%", accuracy)
    points(a - b)  = 100 (a - b)                 (unit "pp", percentage points)

    unit     printed as          rule
    "%"      98.63%              2 decimals (accuracy in percent, an error rate in percent)
    "pp"     +0.57 pp            2 decimals (a difference of percentages)
    "pp/layer" +0.125 pp/layer   3 decimals (a slope of percentages over depth)
    "nats"   0.0512 nats         4 decimals (cross-entropy, CE damage)
    "s"      12.34 s             2 decimals (seconds of a clock)
    "ms"     1.234 ms            3 decimals (milliseconds of a timed forward pass)
    "×"      1.05×               3 significant digits (a ratio; unit name "ratio" too)
    "count"  462                 an integer
    ""       0.0123              4 significant digits (a plain number, e.g. a norm)
    "quoted" 0.9817333           7 significant digits (a value quoted from a seed report's
                                 log, printed as it was logged; never a computed number)

``None`` or a non-finite value prints ``—`` (undefined is never 0). ``suffix=False``
drops the unit text where the column header states it (the terminal's narrow tables).
"""

from __future__ import annotations

import math
from typing import overload

ACCURACY_UNIT = "%"

_MISSING = "—"
# unit -> (format spec of the number, text after it)
_RULES: dict[str, tuple[str, str]] = {
    "%": (".2f", "%"),
    "pp": (".2f", " pp"),
    "pp/layer": (".3f", " pp/layer"),
    "nats": (".4f", " nats"),
    "s": (".2f", " s"),
    "ms": (".3f", " ms"),
    "×": (".3g", "×"),
    "ratio": (".3g", "×"),
    "count": ("d", ""),
    "": (".4g", ""),
    "quoted": (".7g", ""),
}
UNITS = tuple(_RULES)


@overload
def percent(fraction: float) -> float: ...
@overload
def percent(fraction: None) -> None: ...
@overload
def percent(fraction: float | None) -> float | None: ...
def percent(fraction: float | None) -> float | None:
    """``100 * fraction``; ``None`` stays ``None`` (undefined is never 0)."""
    return None if fraction is None else 100.0 * float(fraction)


def _rule(unit: str) -> tuple[str, str]:
    try:
        return _RULES[unit]
    except KeyError:
        raise ValueError(f"unknown unit {unit!r}; known units: {list(_RULES)}") from None


def fmt_value(
    x: float | None,
    unit: str,
    *,
    signed: bool = False,
    digits: int | None = None,
    suffix: bool = True,
) -> str:
    """``x`` (already in ``unit``) by the unit's rule; ``signed`` prints ``+`` on
    differences; ``digits`` overrides the rule's decimals (significant digits for ``×``
    and ``""``)."""
    if x is None or not math.isfinite(float(x)):
        return _MISSING
    spec, text = _rule(unit)
    if unit == "count":
        return f"{int(x):{'+' if signed else ''}d}{text if suffix else ''}"
    if digits is not None:
        spec = f".{digits}{spec[-1]}"
    return f"{float(x):{'+' if signed else ''}{spec}}{text if suffix else ''}"


def fmt_mean_sd(
    mean: float | None,
    sd: float | None,
    n: int | None,
    unit: str,
    *,
    shown_n: int | None = None,
    suffix: bool = True,
) -> str:
    """``mean ± sd unit (n=N)`` (sample SD; no ``±`` without an SD), or ``—``; the
    ``(n=N)`` is left out when ``n`` equals ``shown_n`` (the row states it)."""
    if mean is None or not math.isfinite(float(mean)):
        return _MISSING
    text = fmt_value(mean, unit, suffix=suffix)
    if sd is not None:
        text = f"{fmt_value(mean, unit, suffix=False)} ± {fmt_value(sd, unit, suffix=suffix)}"
    return text if n is None or n == shown_n else f"{text} (n={n})"


def fmt_spread(
    mean: float | None,
    sd: float | None,
    low: float | None,
    high: float | None,
    n: int | None,
    unit: str,
) -> str:
    """Per-seed values as ``mean ± sd [min, max] (n=N)`` (sample SD), the seed-comparison
    cell; ``mean`` alone when there is no SD (one seed)."""
    if sd is None:
        return fmt_value(mean, unit)
    return (
        f"{fmt_value(mean, unit, suffix=False)} ± {fmt_value(sd, unit, suffix=False)} "
        f"[{fmt_value(low, unit, suffix=False)}, {fmt_value(high, unit)}] (n={n})"
    )


def fmt_interval(
    low: float | None,
    high: float | None,
    unit: str,
    *,
    signed: bool = True,
    suffix: bool = True,
) -> str:
    """An interval ``[-0.12 pp, +1.05 pp]`` (``signed``: of a difference), or ``—``."""
    if low is None or high is None:
        return _MISSING
    lo = fmt_value(low, unit, signed=signed, suffix=suffix)
    hi = fmt_value(high, unit, signed=signed, suffix=suffix)
    return f"[{lo}, {hi}]"


def fmt_estimate_interval(
    estimate: float | None,
    low: float | None,
    high: float | None,
    unit: str,
    *,
    signed: bool = False,
    suffix: bool = True,
) -> str:
    """``estimate [low, high]`` in ``unit`` (only the estimate without an interval)."""
    est = fmt_value(estimate, unit, signed=signed, suffix=suffix)
    if low is None or high is None:
        return est
    return f"{est} {fmt_interval(low, high, unit, signed=signed, suffix=suffix)}"


def fmt_percent(fraction: float | None, digits: int = 2) -> str:
    """A fraction as a percentage, ``"98.63%"``; ``"—"`` when undefined or non-finite."""
    return fmt_value(percent(fraction), "%", digits=digits)


def fmt_points(fraction_diff: float | None, digits: int = 2) -> str:
    """A difference of fractions as signed percentage points, ``"-0.57 pp"``."""
    return fmt_value(percent(fraction_diff), "pp", signed=True, digits=digits)


def fmt_level(level: float | None) -> str:
    """A probability (an interval's level, a tolerance) as a percentage with 4 significant
    digits: ``95%``, ``99.69%``."""
    p = percent(level)
    return _MISSING if p is None or not math.isfinite(p) else f"{p:.4g}%"


def fmt_ratio(x: float | None) -> str:
    """A ratio, ``"1.05×"``."""
    return fmt_value(x, "×")
