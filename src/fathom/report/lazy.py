"""Collapsed sections that load when opened: a large ``<details>`` body stored compressed.

A body of at least :data:`LAZY_MIN_BYTES` UTF-8 bytes is stored as
``base64(gzip(body, mtime=0))`` (deterministic bytes) in an inert
``<script type="application/x-fathom-lazy">`` inside its ``<details data-lazy>``; the page
script decodes it (``DecompressionStream("gzip")``, no request) and inserts the HTML the
first time the section opens. The page is smaller (HTML tables compress about tenfold)
and the browser neither parses nor lays out the thousand raw tables that nobody opened. A
smaller body stays inline (a plain ``<details>``). :func:`expanded` returns a page with
every stored body inlined again, byte for byte: what the reader sees after opening every
section, for tests and for ``grep``. The mask explorer's JSON is stored the same way
(:func:`stored_json` reads it back) and decoded when the page starts, after the curves.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from typing import Any

LAZY_MIN_BYTES = 16 * 1024
LAZY_TYPE = "application/x-fathom-lazy"
_STORED = re.compile(rf'<script type="{LAZY_TYPE}">([A-Za-z0-9+/=]*)</script>')


def encode(body: str) -> str:
    """``base64(gzip(body))`` with a zero timestamp: the same body gives the same text."""
    return base64.b64encode(gzip.compress(body.encode(), compresslevel=6, mtime=0)).decode()


def decode(stored: str) -> str:
    """The inverse of :func:`encode`."""
    return gzip.decompress(base64.b64decode(stored)).decode()


def details(summary_html: str, body: str, *, attrs: str = "") -> str:
    """A ``<details>`` with ``summary_html`` (already escaped) over ``body`` (HTML): inline
    below :data:`LAZY_MIN_BYTES`, else stored compressed and loaded when opened (the summary
    then says its size, so a reader knows why it takes a moment)."""
    attrs = f" {attrs}" if attrs else ""
    size = len(body.encode())
    if size < LAZY_MIN_BYTES:
        return f"<details{attrs}><summary>{summary_html}</summary>{body}</details>"
    return (
        f"<details{attrs} data-lazy><summary>{summary_html} "
        f"<span class='note'>({size / 1024:,.0f} KB, loads when opened)</span></summary>"
        f'<script type="{LAZY_TYPE}">{encode(body)}</script></details>'
    )


def stored_json(page: str, script_id: str) -> Any:
    """The JSON a page stores compressed in ``<script id=script_id>`` (the masks)."""
    m = re.search(
        rf'<script type="[^"]*" id="{re.escape(script_id)}">([A-Za-z0-9+/=]*)</script>', page
    )
    if m is None:
        raise KeyError(f"no stored script {script_id!r} in the page")
    return json.loads(decode(m.group(1)))


def expanded(page: str) -> str:
    """``page`` with every stored body inlined in place of its ``<script>``."""
    return _STORED.sub(lambda m: decode(m.group(1)), page)
