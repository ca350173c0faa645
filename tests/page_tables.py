"""Tables read back from rendered pages (HTML and Markdown), for the one-source tests."""

from __future__ import annotations

from html.parser import HTMLParser


class Tables(HTMLParser):
    """Every ``<table>`` of a page: its caption and its rows of cell texts (header first)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[dict] = []
        self._cell: list[str] | None = None
        self._caption: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append({"caption": "", "rows": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "caption":
            self._caption = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1]["rows"][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "caption" and self._caption is not None:
            self.tables[-1]["caption"] = "".join(self._caption).strip()
            self._caption = None

    def handle_data(self, data):
        for part in (self._cell, self._caption):
            if part is not None:
                part.append(data)


def html_tables(page: str) -> dict[str, list[list[str]]]:
    parser = Tables()
    parser.feed(page)
    return {t["caption"]: t["rows"] for t in parser.tables}


def md_tables(md: str) -> dict[str, list[list[str]]]:
    """Markdown tables keyed by their lead line (``title:``), header row first."""
    out, lines = {}, md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| ") and (i < 2 or not lines[i - 1].startswith("|")):
            title = lines[i - 2].removesuffix(":") if i >= 2 else ""
            rows = []
            for row in lines[i:]:
                if not row.startswith("|"):
                    break
                if not row.startswith("|---"):
                    rows.append([c.strip() for c in row.strip("|").split(" | ")])
            out[title] = rows
    return out
