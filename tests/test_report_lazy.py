"""Sections that load when opened: the stored body is the body, byte for byte, and only a
large one is stored; the page with every section expanded is the page a reader opens."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.report.lazy import (
    LAZY_MIN_BYTES,
    LAZY_TYPE,
    decode,
    details,
    encode,
    expanded,
    stored_json,
)

bodies = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300).map(
    lambda t: t * 200  # repeated: both sides of the threshold
)


@settings(max_examples=40, deadline=None)
@given(body=bodies)
@example(body="")
@example(body="é" * (LAZY_MIN_BYTES // 2))  # 16 KiB of UTF-8 bytes in 8 Ki characters
@example(body="x" * (LAZY_MIN_BYTES - 1))
def test_stored_exactly_when_large_and_expanded_back(body: str) -> None:
    page = "<p>before</p>" + details("raw <b>tables</b>", body) + "<p>after</p>"
    stored = LAZY_TYPE in page
    assert stored == (len(body.encode()) >= LAZY_MIN_BYTES)
    if stored:
        assert "data-lazy" in page and "loads when opened" in page
        assert encode(body) == encode(body)  # deterministic bytes (gzip mtime 0)
    full = expanded(page)
    assert LAZY_TYPE not in full and body in full
    assert full.startswith("<p>before</p><details") and full.endswith("</details><p>after</p>")
    assert decode(encode(body)) == body


def test_a_large_section_holds_no_table_until_expanded() -> None:
    body = "<table><tr><td>1</td></tr></table>" * 1000
    page = details("raw", body, attrs="id='r'")
    assert "<table" not in page and page.startswith("<details id='r' data-lazy>")
    assert len(page) < len(body) / 10  # repeated tables compress far below a tenth
    assert expanded(page).count("<table") == 1000


def test_stored_json_reads_the_masks_back() -> None:
    obj = {"tables": [{"key": "a|final", "masks": [1, 2]}], "examples": {"note": "<b>"}}
    page = (
        f'<script type="application/x-fathom-gzip-json" id="m">{encode(json.dumps(obj))}</script>'
    )
    assert stored_json(page, "m") == obj
    with pytest.raises(KeyError, match="no stored script 'other'"):
        stored_json(page, "other")
