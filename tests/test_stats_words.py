"""No comparative word is produced outside :mod:`fathom.stats`: a scan of every string
literal in ``src/`` (docstrings and bare documentation strings aside) lists offenders."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "fathom"
WORDS = re.compile(
    r"\b(better|worse|higher|lower|equivalent|not established|fragile|inconclusive)\b",
    re.IGNORECASE,
)


def _documentation(tree: ast.AST) -> set[int]:
    """ids of docstrings and bare string statements (attribute docs): not produced text."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            out.add(id(node.value))
    return out


def offenders(root: Path = SRC) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("stats/"):
            continue
        tree = ast.parse(path.read_text())
        docs = _documentation(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
                and (m := WORDS.search(node.value))
            ):
                found.append(f"{rel}:{node.lineno}: {m.group(0)!r} in {node.value[:60]!r}")
    return found


def test_no_comparative_word_outside_stats():
    bad = offenders()
    assert not bad, "comparative words outside fathom.stats:\n" + "\n".join(bad)


def test_the_scan_finds_a_planted_word(tmp_path):
    (tmp_path / "x.py").write_text('"""doc: better."""\nMSG = "a is better than b"\n')
    assert offenders(tmp_path) == ["x.py:2: 'better' in 'a is better than b'"]
