"""BENCHMARKS.md (today's figures) and its history appendix: every link lands on a section."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TODAY = ROOT / "BENCHMARKS.md"
HISTORY = ROOT / "docs" / "benchmarks-history.md"
ANCHOR = re.compile(r'^<a id="([a-z0-9-]+)"></a>$', re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading made of ASCII words and punctuation."""
    text = re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(text: str, level: str = "##") -> list[str]:
    return [m.group(1) for m in re.finditer(rf"^{level} (.+)$", text, re.M)]


def test_every_history_section_has_its_own_anchor_right_above_it():
    lines = HISTORY.read_text().splitlines()
    ids = []
    for k, line in enumerate(lines):
        if line.startswith("## ") or line.startswith("### "):
            # a blank line between the anchor and the heading, or the heading renders as HTML
            assert lines[k - 1] == "", line
            m = ANCHOR.fullmatch(lines[k - 2])
            assert m is not None, f"no anchor above {line!r}"
            ids.append(m.group(1))
    assert len(ids) >= 50
    assert len(ids) == len(set(ids)), "anchor ids repeat"
    assert len(ANCHOR.findall("\n".join(lines))) == len(ids), "an anchor without its heading"


def test_links_into_the_history_and_within_benchmarks_resolve():
    ids = set(ANCHOR.findall(HISTORY.read_text()))
    text = TODAY.read_text()
    own = {slug(h) for h in headings(text)}
    links = LINK.findall(text)
    into_history = [t for t in links if t.startswith("docs/benchmarks-history.md#")]
    assert len(into_history) >= 40
    for target in links:
        path, _, frag = target.partition("#")
        if path == "":
            assert frag in own, target
            continue
        assert (ROOT / path).exists(), target
        if path == "docs/benchmarks-history.md" and frag:
            assert frag in ids, target
    assert "../BENCHMARKS.md" in LINK.findall(HISTORY.read_text())


def test_no_file_links_to_a_history_section_that_is_not_there():
    ids = set(ANCHOR.findall(HISTORY.read_text()))
    pattern = re.compile(r"benchmarks-history\.md#([a-z0-9-]+)")
    files = [ROOT / "README.md", ROOT / "Makefile", *ROOT.glob("docs/*.md")]
    files += [*ROOT.glob("bench/*"), *ROOT.glob("tests/*.py"), *ROOT.glob("src/fathom/**/*.py")]
    for path in (f for f in files if f.is_file() and f.suffix != ".pyc"):
        for frag in pattern.findall(path.read_text()):
            assert frag in ids, f"{path.relative_to(ROOT)}: #{frag}"


def test_every_script_named_exists():
    text = TODAY.read_text()
    names = set(re.findall(r"\b(bench_\w+\.py|gpu\.py|gpu_reproduce\.sh|\w+_floor\.py)", text))
    assert len(names) >= 15
    for name in names:
        assert (ROOT / "bench" / name).exists(), name


def test_the_anchor_section_closes_the_file_where_the_policy_points():
    # docs/statistics.md's kernel policy says the new anchor hashes are recorded in BENCHMARKS.md
    assert "BENCHMARKS.md" in (ROOT / "docs" / "statistics.md").read_text()
    text = TODAY.read_text()
    assert headings(text)[-1] == "Reproducibility anchor"
    section = text[text.index("## Reproducibility anchor") :]
    rows = [line for line in section.splitlines() if line.startswith("| 20")]
    assert len(rows) >= 5 and all("benchmarks-history.md#" in row for row in rows)
