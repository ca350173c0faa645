"""A soft report of how ``src/fathom`` is cut: never a failing check.

Modules are cut by idea, not by a line count (docs/architecture.md, "Structure"): a module
holds one idea with its helpers, and a module whose only caller is one other module
usually belongs in that caller. This report lists, for a reader deciding where to cut:

* per package: modules and lines (physical lines, blank and comment lines included);
* modules above ``--module-lines`` and functions above ``--function-lines`` (``def`` to its
  last line, decorators excluded): places to look at, not offences;
* modules imported by exactly one other fathom module (any import: module level, in a
  function, under ``TYPE_CHECKING``; a lazy export counts as an import of its module),
  with the caller and the module's size: fragments that may belong in their caller.

It reads the import graph with the parser the structure test enforces the layers with
(``tests/test_structure.py``), so the two never disagree on what an import is.

    python scripts/size_report.py [--root src/fathom] [--module-lines 500] [--function-lines 100]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_structure import imports, modules  # noqa: E402


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def package_of(module: str) -> str:
    """``fathom.rundir.writer`` -> ``rundir``; a top-level module is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(fathom)"


def package_sizes(root: Path) -> dict[str, tuple[int, int]]:
    """Per package, (modules, lines)."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, path in modules(root).items():
        row = out[package_of(name)]
        row[0] += 1
        row[1] += _lines(path)
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


def long_functions(root: Path, limit: int) -> list[tuple[int, str]]:
    out = []
    for path in modules(root).values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > limit:
                    out.append((n, f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def long_modules(root: Path, limit: int) -> list[tuple[int, str]]:
    out = [(_lines(p), str(p.relative_to(root.parent))) for p in modules(root).values()]
    return sorted((row for row in out if row[0] > limit), reverse=True)


def single_callers(root: Path) -> list[tuple[str, str, int]]:
    """(module, its one importer, lines) for every non-package module that exactly one other
    module imports; a package's ``__init__`` importing its own submodule counts as a caller."""
    known = modules(root)
    callers: dict[str, set[str]] = defaultdict(set)
    for edge in imports(root):
        callers[edge.target].add(edge.source)
    out = []
    for name, path in known.items():
        if path.name == "__init__.py" or name.endswith((".cli", "__main__")):
            continue
        if len(callers[name]) == 1:
            (caller,) = callers[name]
            out.append((name, caller, _lines(path)))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT / "src" / "fathom")
    parser.add_argument("--module-lines", type=int, default=500)
    parser.add_argument("--function-lines", type=int, default=100)
    args = parser.parse_args(argv)
    root = args.root.resolve()

    sizes = package_sizes(root)
    print(f"{'package':<12} {'modules':>7} {'lines':>7}")
    for package, (n, lines) in sizes.items():
        print(f"{package:<12} {n:>7} {lines:>7}")
    total = (sum(n for n, _ in sizes.values()), sum(v for _, v in sizes.values()))
    print(f"{'total':<12} {total[0]:>7} {total[1]:>7}")

    big = long_modules(root, args.module_lines)
    print(f"\nmodules over {args.module_lines} lines: {len(big)}")
    for n, where in big:
        print(f"  {n:>5}  {where}")
    fns = long_functions(root, args.function_lines)
    print(f"\nfunctions over {args.function_lines} lines: {len(fns)}")
    for n, where in fns:
        print(f"  {n:>5}  {where}")

    single = single_callers(root)
    siblings = sum(1 for m, c, _ in single if m.rpartition(".")[0] == c.rpartition(".")[0])
    small = Counter(lines < 100 for _, _, lines in single)[True]
    print(
        f"\nmodules imported by exactly one module: {len(single)} "
        f"({siblings} by a sibling, {small} under 100 lines)"
    )
    for name, caller, lines in single:
        print(f"  {lines:>5}  {name}  <- {caller}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
