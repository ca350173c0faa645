"""Where each top-level public name of ``src/fathom`` is used: a report, never a failing check.

For every top-level public name (function, class, constant: no leading underscore) of every
module under ``src/fathom``, the report says who refers to it:

* ``other-src``: another module of ``src/fathom``;
* ``exported``: only the package's declared surface (``__all__``, a ``fathom.base.lazy``
  ``exports`` table, a ``forward``-ed module) besides its own module;
* ``docs``: README.md, ``docs/*.md`` or ``examples/`` (what users are shown), and no src;
* ``outside-only``: only ``tests/``, ``bench/`` or ``scripts/``, and its own module uses it
  (API its tests reach);
* ``test-only``: only ``tests/``, ``bench/`` or ``scripts/``, and nothing in ``src`` calls it:
  a test helper belongs in ``tests/``; a reader or function meant for users stays;
* ``own-module``: only its own module (public by accident: a candidate for a leading
  underscore, unless it is a type a public signature or field names, or a ``nn.Module``
  whose class name a model's printout and the audit's labels show);
* ``unused``: nothing, not even its own module after its definition (a candidate to delete).

A python file refers to ``fathom.pkg.mod.NAME`` when it names the module (``fathom.pkg.mod``
anywhere, or ``from fathom.pkg import mod``), or names the package and ``NAME`` is on the
package's surface, and it reaches ``NAME``: imports it from there, reads an attribute
``NAME``, or has the word in a string or comment (``"module:function"`` paths, ``getattr``
and ``monkeypatch`` by string, docstrings). A non-python file (markdown, toml, js)
refers to ``NAME`` when the word occurs in it at all. Both rules over-count uses, never
under-count: a name the report calls ``own-module`` or ``unused`` is safe to make private or
delete. ``pyproject.toml`` entry points are read as text, like any other file.

    python scripts/public_names.py [--list own-module,unused] [--package depth]
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "fathom"
OUTSIDE = ("tests", "bench", "scripts")
DOCS = ("README.md", "docs", "examples", "BENCHMARKS.md")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".js", ".txt", ".sh", ".cfg", ".ini", ".json"}
CATEGORIES = ("other-src", "exported", "docs", "outside-only", "test-only", "own-module", "unused")


def module_name(path: Path) -> str:
    """``src/fathom/pkg/mod.py`` -> ``fathom.pkg.mod``; a package ``__init__`` -> the package."""
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def top_level_names(tree: ast.Module) -> dict[str, str]:
    """Public names bound at module level -> kind (``function``, ``class``, ``constant``)."""
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = "function"
        elif isinstance(node, ast.ClassDef):
            names[node.name] = "class"
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names[target.id] = "constant"
    return {n: k for n, k in names.items() if not n.startswith("_")}


def surface(tree: ast.Module) -> dict[str, set[str]]:
    """A package's declared surface: module -> names (``exports`` tables, ``forward``)."""
    out: dict[str, set[str]] = defaultdict(set)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id == "exports" and len(node.args) == 2 and isinstance(node.args[1], ast.Dict):
            for key, value in zip(node.args[1].keys, node.args[1].values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(value, ast.List):
                    out[key.value].update(
                        e.value for e in value.elts if isinstance(e, ast.Constant)
                    )
        elif node.func.id == "forward" and len(node.args) == 2:
            target = node.args[1]
            if isinstance(target, ast.Constant):
                out[target.value].add("*")
    return out


def dunder_all(tree: ast.Module) -> set[str]:
    """Literal strings of a module's ``__all__``."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return {n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant)}
    return set()


def text_files() -> list[Path]:
    """Every text file of the tree that could refer to a name (src, tests, docs, ...)."""
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "pyproject.toml"]
    for top in ("src", *OUTSIDE, "docs", "examples"):
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in TEXT_SUFFIXES]
    return [p for p in files if p.is_file() and "__pycache__" not in p.parts]


def where(path: Path) -> str:
    """``src``, ``docs`` or ``outside`` for a file of the tree."""
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "src":
        return "src"
    if rel.parts[0] in DOCS:
        return "docs"
    return "outside"


def names_module(text: str, module: str) -> bool:
    """Does ``text`` name ``module`` (dotted, or ``from parent import leaf``)?"""
    if re.search(re.escape(module) + r"(?![\w])", text):
        return True
    parent, _, leaf = module.rpartition(".")
    return bool(parent) and bool(
        re.search(rf"from {re.escape(parent)} import [^\n]*\b{leaf}\b", text)
        or re.search(rf"from {re.escape(parent)} import \([^)]*\b{leaf}\b", text)
    )


class Reach:
    """What a python file can reach another module's name by: the names it imports
    (``from module import name``), attribute names (``module.name``), the words of its
    strings (``"module:function"``, ``getattr``, ``monkeypatch`` targets, docstrings) and
    comments, and the modules it star-imports. A bare word that is none of these is the
    file's own name, not a use."""

    def __init__(self, text: str) -> None:
        tree = ast.parse(text)
        self.imported: set[tuple[str, str]] = set()
        self.star: set[str] = set()
        self.attrs: set[str] = set()
        self.string_words: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if alias.name == "*":
                        self.star.add(node.module)
                    self.imported.add((node.module, alias.name))
            elif isinstance(node, ast.Attribute):
                self.attrs.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                self.string_words |= set(re.findall(r"\w+", node.value))
        comments = re.findall(r"#[^\n]*", text)
        self.string_words |= {w for c in comments for w in re.findall(r"\w+", c)}

    def reaches(self, module: str, name: str, via_package: str | None) -> bool:
        """Can this file reach ``module.name`` (or ``via_package.name``)?"""
        homes = [module] + ([via_package] if via_package else [])
        return (
            any((home, name) in self.imported or home in self.star for home in homes)
            or name in self.attrs
            or name in self.string_words
        )


def classify() -> list[dict]:
    """One row per public top-level name: module, name, kind, category, referrers."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    trees = {m: ast.parse(p.read_text()) for m, p in modules.items()}
    on_surface: dict[str, set[str]] = defaultdict(set)  # module -> names a package shows
    for m, p in modules.items():
        if p.name == "__init__.py":
            for target, names in surface(trees[m]).items():
                on_surface[target] |= names
            on_surface[m] |= dunder_all(trees[m])
    texts = {p: p.read_text(errors="replace") for p in text_files()}
    words = {p: set(re.findall(r"\w+", t)) for p, t in texts.items()}
    reach: dict[Path, Reach] = {}
    rows = []
    for m, path in sorted(modules.items()):
        tree = trees[m]
        own_all = dunder_all(tree)
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        own_tokens = Counter(re.findall(r"\w+", modules[m].read_text()))
        loaded = {
            n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
        for name, kind in top_level_names(tree).items():
            declared = name in own_all or name in on_surface[m] or "*" in on_surface[m]
            refs: dict[str, list[str]] = defaultdict(list)
            for p, text in texts.items():
                if p == path or name not in words[p]:
                    continue
                if p.suffix == ".py":
                    if p.name == "__init__.py" and module_name(p) == package and declared:
                        continue  # the package's own export table is not a use
                    by_module = names_module(text, m)
                    by_package = declared and package != m and names_module(text, package)
                    if not (by_module or by_package):
                        continue
                    if p not in reach:
                        reach[p] = Reach(text)
                    if not reach[p].reaches(m, name, package if by_package else None):
                        continue
                refs[where(p)].append(str(p.relative_to(ROOT)))
            if refs["src"]:
                category = "other-src"
            elif refs["docs"]:
                category = "docs"
            elif refs["outside"]:
                category = "outside-only" if name in loaded else "test-only"
            elif declared:
                category = "exported"
            elif own_tokens[name] > 1:
                category = "own-module"
            else:
                category = "unused"
            rows.append(
                {"module": m, "name": name, "kind": kind, "category": category, "refs": refs}
            )
    return rows


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (SRC / parts[1]).is_dir()) else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", default="", help="categories to list name by name")
    parser.add_argument("--package", default=None, help="only this package (e.g. depth)")
    args = parser.parse_args(argv)
    rows = classify()
    if args.package:
        rows = [r for r in rows if package_of(r["module"]) == args.package]
    per_package: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        per_package[package_of(row["module"])][row["category"]] += 1
    total = Counter(row["category"] for row in rows)
    print(f"{len(rows)} public top-level names")
    print(f"{'package':14}" + "".join(f"{c:>13}" for c in CATEGORIES) + f"{'total':>8}")
    for package in sorted(per_package):
        counts = per_package[package]
        cells = "".join(f"{counts[c]:>13}" for c in CATEGORIES)
        print(f"{package:14}{cells}{sum(counts.values()):>8}")
    print(f"{'all':14}" + "".join(f"{total[c]:>13}" for c in CATEGORIES) + f"{len(rows):>8}")
    wanted = [c for c in args.list.split(",") if c]
    for row in rows:
        if row["category"] in wanted:
            users = ", ".join(sorted({f for fs in row["refs"].values() for f in fs}))
            print(f"{row['category']:12} {row['module']}.{row['name']} ({row['kind']}) {users}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
