"""Terminal tables that fit 80 columns without cutting identifiers.

Rules every command follows: a table fits :data:`WIDTH` columns at the default width; run
ids, hashes, statuses and verdict words are *key* cells — never wrapped, never cut with an
ellipsis (they get their full width, other cells wrap onto more lines); hashes are shown
as their first :data:`HASH_CHARS` hex digits, in full with ``--wide`` (or ``--json``, which
prints every value). Imports of ``rich`` happen inside the functions, so importing this
module costs nothing at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

WIDTH = 80
"""The terminal width every default table fits."""

WIDE_WIDTH = 250
"""The console width used with ``--wide`` (long rows are not wrapped)."""

HASH_CHARS = 12
"""Hex digits of a shortened hash (48 bits: a collision among a study's runs is negligible)."""


def short_hash(value: str | None, wide: bool = False) -> str:
    """``value[:12]`` (or all of it with ``wide``); ``"—"`` when there is none."""
    if not value:
        return "—"
    return value if wide else value[:HASH_CHARS]


def console(wide: bool = False, *, stderr: bool = False) -> Console:
    """A rich console: the terminal's width, or :data:`WIDE_WIDTH` with ``wide``."""
    from rich.console import Console

    return Console(width=WIDE_WIDTH if wide else None, stderr=stderr)


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    wrap: Sequence[str] = (),
    right: Sequence[str] = (),
    caption: str | None = None,
) -> RenderableType:
    """A compact table whose cells are never wrapped or cut, except the ``wrap`` columns.

    Identifiers, numbers, hashes and verdict words keep their full width (a number is never
    split across lines); ``wrap`` columns (free text) fold onto more lines instead of being
    cut. A header may hold ``\n`` to stack its words. Columns are separated by one space.
    The title is a line of its own above the table (wrapped at the terminal's width, not
    the table's).
    """
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    out = Table(
        caption=caption,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        padding=(0, 0),
        title_justify="left",
        caption_justify="left",
    )
    cells = [[str(c) for c in r] for r in rows]
    for i, name in enumerate(columns):
        justify = "right" if name in right else "left"
        if name in wrap:
            out.add_column(name, overflow="fold", justify=justify)
            continue
        widest = max([len(r[i]) for r in cells] + [len(x) for x in name.split("\n")])
        out.add_column(name, no_wrap=True, min_width=widest, overflow="ignore", justify=justify)
    for r in cells:
        out.add_row(*r)
    return out if title is None else Group(Text(title, style="bold"), out)
