"""The comparison formatters of :mod:`fathom.stats`, on top of the one formatter per unit
(:mod:`fathom.units`: ``fmt_value``, ``fmt_mean_sd``, ``fmt_level``, each unit's rule
written once). A comparison on the log scale prints as a ratio ``exp d``.
"""

from __future__ import annotations

import math

from fathom.stats.results import Cell, Comparison, Table
from fathom.units import fmt_interval as fmt_bounds
from fathom.units import fmt_mean_sd, fmt_value


def _on_scale(c: Comparison, x: float | None, signed: bool) -> str:
    if c.quantity.scale == "log ratio":
        return fmt_value(None if x is None else math.exp(x), "×")
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
        return f"[{fmt_value(math.exp(-d), '×')}, {fmt_value(math.exp(d), '×')}]"
    return f"±{fmt_value(d, c.quantity.unit)}"


def fmt_cell(cell: Cell, *, shown_n: int | None = None, suffix: bool = True) -> str:
    """The one rendering of a :class:`Cell` (every renderer of a :class:`Table` uses it).

    ``text`` cells print as they are; a cell with ``low``/``high`` prints
    ``value [low, high]`` (signed); otherwise ``value ± sd``. ``(n=N)`` follows unless
    ``n`` equals ``shown_n`` (the row's own n column); ``suffix=False`` drops the unit
    text where the column header states it.
    """
    if cell.text is not None:
        return cell.text
    if cell.low is not None or cell.high is not None:
        body = fmt_bounds(cell.low, cell.high, cell.unit, signed=cell.signed, suffix=suffix)
        if cell.value is not None:
            body = f"{fmt_value(cell.value, cell.unit, signed=True, suffix=suffix)} {body}"
    elif cell.sd is not None:
        body = fmt_mean_sd(cell.value, cell.sd, None, cell.unit, suffix=suffix)
    else:
        body = fmt_value(cell.value, cell.unit, signed=cell.signed, suffix=suffix)
    if body == "—" or cell.n is None or cell.n == shown_n:
        return body
    return f"{body} (n={cell.n})"


def table_text(table: Table, *, suffix: bool = True) -> list[list[str]]:
    """Every cell of ``table`` as printed text (:func:`fmt_cell`, each row's own n
    omitted from its cells): what every renderer of a :class:`Table` lays out."""
    return [[fmt_cell(c, shown_n=table.row_n(r), suffix=suffix) for c in r] for r in table.rows]
