"""HTML table primitives (and small inline SVG spectra) for the report's static sections.

Rendered once in Python: these sections are static, so the page script only sorts and
filters them. Any JSON the report does not know field by field (a future audit or
curvature key) is still shown, by :func:`generic`: scalars as key/value rows, lists of
records as sortable, filterable tables, long lists of numbers as spectra. The raw
sections built from them (study summary, provenance, audit, curvature) are
:mod:`fathom.report.raw`.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from itertools import count
from typing import Any

_ids = count()


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


_BREAKS = re.compile(r" (?=\[|± )|(?<=,) ")  # before "[lo, hi]" or "± sd"; after a comma


def wrappable(text: Any) -> str:
    """Escaped cell text that may break only before its interval or its ``± SD`` and after
    a comma (each part kept whole): ``+0.35 pp`` / ``[-3.66 pp,`` / ``+4.35 pp]``."""
    parts = _BREAKS.split(str(text))
    if len(parts) == 1:
        return esc(text)
    return " ".join(f"<span class='nw'>{esc(p)}</span>" for p in parts)


def headline_table(
    tid: str, caption: str, head: list[str], rows: list[list[str]], label_columns: int = 1
) -> str:
    """A headline ``<table>`` (class ``fit``: it fits its box by breaking a number cell
    before its interval or SD, :func:`wrappable`): escaped cells, the columns after the
    first ``label_columns`` right-aligned as numbers (class ``num``)."""
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='{'num' if i >= label_columns else ''}'>{wrappable(c)}</td>"
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return (
        f"<table class='headline fit' id='{tid}'><caption>{esc(caption)}</caption><thead><tr>"
        + "".join(f"<th>{esc(h)}</th>" for h in head)
        + f"</tr></thead><tbody>{body}</tbody></table>"
    )


def cell(v: Any) -> str:
    """A value as table text: ``—`` for null, 6 significant digits for floats, JSON otherwise."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else str(v)
    if isinstance(v, int | str):
        return str(v)
    text = json.dumps(v, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    interactive: bool = False,
    caption: str | None = None,
) -> str:
    """An HTML table; ``interactive`` adds click-to-sort headers and a text filter."""
    tid = f"t{next(_ids)}"
    parts = []
    if interactive:
        parts.append(
            f'<input class="table-filter" data-table="{tid}" placeholder="filter rows..." '
            f'aria-label="filter rows of table {tid}">'
        )
    cls = "sortable" if interactive else ""
    parts.append(f'<table id="{tid}" class="{cls}">')
    if caption:
        parts.append(f"<caption>{esc(caption)}</caption>")
    parts.append("<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr></thead>")
    parts.append("<tbody>")
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{esc(cell(v))}</td>" for v in row) + "</tr>")
    parts.append("</tbody></table>")
    return "\n".join(parts)


def _spectrum_svg(values: Sequence[float], title: str) -> str:
    """Sorted (descending) values against their rank; log10 axis when all are positive."""
    ys = sorted(
        (float(v) for v in values if v is not None and math.isfinite(float(v))), reverse=True
    )
    if not ys:
        return f"<p>{esc(title)}: no finite values</p>"
    log = all(y > 0 for y in ys)
    t = [math.log10(y) for y in ys] if log else ys
    lo, hi = min(t), max(t)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    w, h, pad = 360, 160, 30
    n = max(len(t) - 1, 1)
    pts = " ".join(
        f"{pad + i / n * (w - pad - 6):.1f},{6 + (1 - (v - lo) / (hi - lo)) * (h - pad - 6):.1f}"
        for i, v in enumerate(t)
    )
    scale = "log10 scale" if log else "linear scale"
    return (
        f'<figure class="spectrum"><svg viewBox="0 0 {w} {h}" width="{w}" height="{h}">'
        f'<rect x="{pad}" y="6" width="{w - pad - 6}" height="{h - pad - 6}" class="frame"/>'
        f'<polyline points="{pts}" fill="none" stroke="#1f77b4"/>'
        f'<text x="{pad}" y="{h - 8}">rank 1..{len(ys)}</text>'
        f'<text x="2" y="14">{ys[0]:.3g}</text><text x="2" y="{h - pad}">{ys[-1]:.3g}</text>'
        f"</svg><figcaption>{esc(title)} ({len(ys)} values, {scale})</figcaption></figure>"
    )


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, bool | int | float | str)


def _is_numbers(v: Any) -> bool:
    return (
        isinstance(v, list)
        and len(v) > 0
        and all(x is None or (isinstance(x, int | float) and not isinstance(x, bool)) for x in v)
    )


def flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings flattened to dotted keys (``{"val": {"acc": 1}} -> {"val.acc": 1}``);
    values that are neither mappings nor scalars (lists) are dropped."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat(v, key + "."))
        elif _is_scalar(v):
            out[key] = v
    return out


def _has_lists(v: Any) -> bool:
    if isinstance(v, Mapping):
        return any(_has_lists(x) for x in v.values())
    return isinstance(v, list)


def _label(item: Mapping[str, Any], i: int) -> str:
    for key in ("run_id", "name", "id", "mask", "recipe", "arm", "epoch", "checkpoint"):
        if key in item and _is_scalar(item[key]):
            return f"{key} {item[key]}"
    return f"item {i}"


def generic(obj: Any, title: str = "", depth: int = 0) -> str:
    """Render arbitrary JSON: see the module docstring."""
    head = f"<h{min(3 + depth, 6)}>{esc(title)}</h{min(3 + depth, 6)}>" if title else ""
    if _is_scalar(obj):
        return f"{head}<p>{esc(cell(obj))}</p>"
    if _is_numbers(obj):
        if len(obj) >= 8:
            return head + _spectrum_svg(obj, title or "values")
        return f"{head}<p>{esc(cell(obj))}</p>"
    if isinstance(obj, list):
        if obj and all(isinstance(x, Mapping) for x in obj):
            flats = [flat(x) for x in obj]
            keys: list[str] = []
            for x in flats:
                keys += [k for k in x if k not in keys]
            out = [
                head,
                table(keys, [[x.get(k) for k in keys] for x in flats], interactive=len(obj) > 5),
            ]
            if depth < 8:
                out += [
                    f"<details><summary>{esc(_label(x, i))}: nested tables</summary>{generic(x, '', depth + 1)}</details>"
                    for i, x in enumerate(obj)
                    if _has_lists(x)
                ]
            return "\n".join(out)
        return f"{head}<p>{esc(cell(obj))}</p>"
    if (
        isinstance(obj, Mapping)
        and len(obj) > 1
        and all(
            isinstance(v, Mapping) and all(_is_scalar(x) for x in v.values()) for v in obj.values()
        )
    ):
        keys = []
        for v in obj.values():
            keys += [k for k in v if k not in keys]
        rows = [[k, *(v.get(c) for c in keys)] for k, v in obj.items()]
        return head + table(["key", *keys], rows, interactive=len(rows) > 5)
    if isinstance(obj, Mapping):
        scalars = [
            (k, v) for k, v in obj.items() if _is_scalar(v) or (_is_numbers(v) and len(v) < 8)
        ]
        others = [
            (k, v) for k, v in obj.items() if not (_is_scalar(v) or (_is_numbers(v) and len(v) < 8))
        ]
        out = [head]
        if scalars:
            out.append(table(["key", "value"], scalars))
        if depth >= 8:
            out += [f"<p>{esc(k)}: {esc(cell(v))}</p>" for k, v in others]
            return "\n".join(out)
        for k, v in others:
            if _is_numbers(v):
                out.append(_spectrum_svg(v, str(k)))
            else:
                out.append(
                    f"<details open><summary>{esc(k)}</summary>{generic(v, '', depth + 1)}</details>"
                )
        return "\n".join(out)
    return f"{head}<p>{esc(cell(obj))}</p>"
