"""The structure rules of docs/architecture.md, enforced over ``src/fathom``.

* every function or method is at most :data:`MAX_FUNCTION_LINES` lines (``def`` to its last
  line, decorators excluded), every module at most :data:`MAX_MODULE_LINES` lines;
* no import cycle among fathom modules, counting every import: at module level, inside a
  function (lazy) and under ``if TYPE_CHECKING:``. A lazy import only defers a dependency
  and a type-checking import is still one (the type checker, the reader and the next
  refactor follow it): hiding an edge is never a way out of a circle;
* one direction of flow: a module imports only from its own layer or from layers before it
  in :data:`LAYERS`, for the same three kinds of import: a lazy import is cheaper at
  start-up, never a licence to reach upwards.

A submodule's implicit import of its own package (``fathom.seam.pex`` runs
``fathom/seam/__init__.py`` first) is not an edge: a package ``__init__`` may import its
submodules, and none of them may import it back (that would be an edge, and a circle).

The checks are plain functions over a source tree, so the last test runs them on a small
tree made to break each rule: every check here can fail.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "fathom"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 350

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("fathom.errors", "fathom.base")),
    ("config", ("fathom.config",)),
    ("data", ("fathom.data",)),
    ("model", ("fathom.models", "fathom.depth", "fathom.losses", "fathom.seam")),
    ("run directory", ("fathom.rundir",)),
    ("instruments", ("fathom.telemetry", "fathom.dynamics")),
    ("trainer", ("fathom.train",)),
    (
        "analyses",
        ("fathom.curvature", "fathom.audit", "fathom.stats", "fathom.study", "fathom.depthscale"),
    ),
    (
        "reports/exports",
        ("fathom.report", "fathom.export", "fathom.reproduce", "fathom.integrations"),
    ),
    ("commands", ("fathom", "fathom.cli", "fathom.__main__")),
)
"""Layers in the order of docs/architecture.md's "Import layers" (lowest first), each with
the packages (module prefixes) it holds. Every ``cli`` module of a package
(``fathom.<pkg>.cli``) is a command, whatever its package."""

TOP_LEVEL = {"fathom", "fathom.__main__", "fathom.cli", "fathom.errors"}
"""The only modules beside the packages: the commands and :mod:`fathom.errors`, which users
import (``except fathom.errors.FathomError``); everything else lives in a package."""


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of ``module``: commands for ``*.cli``, else the longest prefix."""
    if module.rsplit(".", 1)[-1] == "cli":
        return len(LAYERS) - 1
    best, best_len = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or (prefix != "fathom" and module.startswith(prefix + "."))
            if matches and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported fathom module
    path: Path
    line: int
    lazy: bool  # inside a function body: runs when the function is first called
    type_checking: bool = False  # under ``if TYPE_CHECKING:`` (at any depth)

    @property
    def how(self) -> str:
        if self.type_checking:
            return "under TYPE_CHECKING"
        return "inside a function" if self.lazy else "at module level"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _type_checking_block(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(
    tree: ast.Module,
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import statement with ``lazy`` (inside a function body, run when it is called)
    and ``type_checking`` (inside an ``if TYPE_CHECKING:`` body; its ``else`` runs)."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    stack: list[tuple[ast.AST, bool, bool]] = [(tree, False, False)]
    while stack:
        node, lazy, checking = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, lazy, checking
        inner = lazy or isinstance(node, functions)
        if _type_checking_block(node):
            assert isinstance(node, ast.If)
            stack.extend((n, inner, True) for n in node.body)
            stack.extend((n, inner, checking) for n in node.orelse)
            continue
        stack.extend((n, inner, checking) for n in ast.iter_child_nodes(node))


def lazy_tables(known: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Per package, the names its ``__init__`` exports lazily (:mod:`fathom.base.lazy`) and the
    module defining each: ``exports(__name__, {module: [names]})`` -> ``{name: module}``,
    ``forward(__name__, module)`` -> ``{"*": module}`` (every name)."""
    out: dict[str, dict[str, str]] = {}
    for package, path in known.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            call = node.value if isinstance(node, ast.Assign) else None
            if not isinstance(call, ast.Call) or len(call.args) < 2:
                continue
            func = call.func.attr if isinstance(call.func, ast.Attribute) else call.func
            func = func.id if isinstance(func, ast.Name) else func
            table = ast.literal_eval(call.args[1]) if func in ("exports", "forward") else None
            if func == "exports":
                out[package] = {n: m for m, names in table.items() for n in names}
            elif func == "forward":
                out[package] = {"*": table}
    return out


def _targets(
    node: ast.Import | ast.ImportFrom,
    source: str,
    is_package: bool,
    known: set[str],
    tables: dict[str, dict[str, str]],
) -> list[str]:
    """The fathom modules an import statement loads (``from pkg import sub`` -> ``pkg.sub``;
    ``from pkg import Name`` -> ``pkg`` and, where ``pkg`` exports ``Name`` lazily, the module
    defining it: a lazy export defers an edge, it does not remove it)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = source.split(".") if is_package else source.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        table = tables.get(base, {})
        names += [
            table.get(a.name, table.get("*", base))
            for a in node.names
            if f"{base}.{a.name}" not in known
        ]
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != source and name not in out:
            out.append(name)
    return out


def imports(root: Path) -> list[Import]:
    """Every import of one fathom module by another under ``root``."""
    known = modules(root)
    tables = lazy_tables(known)
    out = []
    for source, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        for node, lazy, checking in _import_nodes(tree):
            for target in _targets(node, source, is_package, set(known), tables):
                out.append(Import(source, target, path, node.lineno, lazy, checking))
    return out


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    out = []
    for path in modules(root).values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > limit:
                    out.append(f"{_rel(path)}:{node.lineno} {node.name}: {n} lines")
    return out


def long_modules(root: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    out = []
    for path in modules(root).values():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out.append(f"{_rel(path)}: {n} lines")
    return out


def import_cycles(edges: Iterable[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), over every edge:
    module-level, lazy and TYPE_CHECKING alike."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def layer_violations(edges: Iterable[Import]) -> list[str]:
    out = []
    for e in edges:
        src, dst = layer_of(e.source), layer_of(e.target)
        if src >= 0 and dst > src:
            out.append(
                f"{_rel(e.path)}:{e.line} {e.source} ({LAYERS[src][0]}) imports {e.target} "
                f"({LAYERS[dst][0]}) {e.how}"
            )
    return out


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def _report(title: str, items: list[str]) -> str:
    return f"{len(items)} {title}:\n  " + "\n  ".join(items)


# ---------------------------------------------------------------------------------------------


def test_every_function_fits():
    offenders = long_functions(PACKAGE)
    assert not offenders, _report(f"functions over {MAX_FUNCTION_LINES} lines", offenders)


def test_every_module_fits():
    offenders = long_modules(PACKAGE)
    assert not offenders, _report(f"modules over {MAX_MODULE_LINES} lines", offenders)


def test_no_import_cycles():
    cycles = import_cycles(imports(PACKAGE))
    assert not cycles, _report("import cycles", [" <-> ".join(c) for c in cycles])


def test_the_top_level_holds_packages():
    flat = {m for m, p in modules(PACKAGE).items() if p.parent == PACKAGE}
    assert flat == TOP_LEVEL, _report("modules beside the packages", sorted(flat - TOP_LEVEL))


def test_every_module_has_a_layer():
    orphans = [m for m in modules(PACKAGE) if layer_of(m) < 0]
    assert not orphans, _report("modules in no layer (add them to LAYERS)", orphans)


def test_imports_follow_the_layers():
    offenders = layer_violations(imports(PACKAGE))
    assert not offenders, _report("imports from a later layer", offenders)


def test_layers_are_those_of_the_architecture_doc():
    """The doc's "Import layers" sentence names the layers of :data:`LAYERS`, in order."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    match = re.search(r"Import layers[^:]*:\s*(.+?)\.\n", text, re.S)
    assert match, f"{ARCHITECTURE} has no 'Import layers: a, b, ...' sentence"
    named = [re.sub(r"\s+", " ", s).strip() for s in match.group(1).split(",")]
    assert named == [name for name, _ in LAYERS]


def _write(pkg: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_catch_what_they_forbid(tmp_path: Path):
    pkg = tmp_path / "fathom"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tc = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
    _write(
        pkg,
        {
            "__init__.py": "",
            "errors.py": "",
            # a circle at module level, one through a lazy import, one through TYPE_CHECKING
            "data/a.py": "import fathom.data.b\n",
            "data/b.py": "from fathom.data import a\n",
            "models/c.py": "import fathom.models.d\n",
            "models/d.py": "def f():\n    from fathom.models import c\n",
            "rundir/e.py": "import fathom.rundir.f\n",
            "rundir/f.py": tc
            + "    from fathom.rundir import e\nelse:\n    import fathom.errors\n",
            # upward: lazily, and for a type only (typing.TYPE_CHECKING, inside a function)
            "train/loop.py": "def f():\n    from fathom.report import html\n" + body + "\n",
            "depth.py": "import typing\ndef g():\n    if typing.TYPE_CHECKING:\n"
            "        from fathom.train import loop\n",
            "report/html.py": "\n" * MAX_MODULE_LINES + "x = 1\n",
        },
    )
    edges = imports(pkg)
    assert import_cycles(edges) == [
        ["fathom.data.a", "fathom.data.b"],
        ["fathom.models.c", "fathom.models.d"],
        ["fathom.rundir.e", "fathom.rundir.f"],
    ]
    hidden = [e for e in edges if not e.lazy and not e.type_checking]
    assert import_cycles(hidden) == [["fathom.data.a", "fathom.data.b"]]  # what lazy-blind saw
    kinds = {(e.source, e.target): e.how for e in edges}
    assert kinds[("fathom.rundir.f", "fathom.rundir.e")] == "under TYPE_CHECKING"
    assert kinds[("fathom.rundir.f", "fathom.errors")] == "at module level"  # the else: runs
    assert kinds[("fathom.models.d", "fathom.models.c")] == "inside a function"
    violations = layer_violations(edges)
    assert [v.split(" ", 1)[1] for v in violations] == [
        "fathom.depth (model) imports fathom.train.loop (trainer) under TYPE_CHECKING",
        "fathom.train.loop (trainer) imports fathom.report.html (reports/exports) "
        "inside a function",
    ]
    assert [s.split(" ", 1)[1] for s in long_functions(pkg)] == [
        f"f: {MAX_FUNCTION_LINES + 2} lines"
    ]
    assert long_modules(pkg) == [f"{pkg / 'report' / 'html.py'}: {MAX_MODULE_LINES + 1} lines"]


def test_a_name_through_a_lazy_package_is_an_edge_to_its_module(tmp_path: Path):
    """``from pkg import Name`` where ``pkg`` exports ``Name`` lazily (``exports`` or
    ``forward``) loads the defining module when used: a circle through it is a circle."""
    pkg = tmp_path / "fathom"
    lazy = "from fathom.base.lazy import exports, forward\n"
    _write(
        pkg,
        {
            "__init__.py": "",
            "rundir/__init__.py": lazy
            + 'x, y, z = exports(__name__, {"fathom.rundir.g": ["G"]})\n',
            "rundir/g.py": "import fathom.rundir.h\nG = 1\n",
            "rundir/h.py": "def f():\n    from fathom.rundir import G\n",
            "config/__init__.py": lazy + 'x, y = forward(__name__, "fathom.config.run")\n',
            "config/run.py": "import fathom.config.models\n",
            "config/models.py": "from fathom.config import RunConfig, models\n",
            "base/__init__.py": "",
            "base/lazy.py": "",
        },
    )
    edges = imports(pkg)
    assert import_cycles(edges) == [
        ["fathom.config.models", "fathom.config.run"],
        ["fathom.rundir.g", "fathom.rundir.h"],
    ]
    assert {e.target for e in edges if e.source == "fathom.config.models"} == {
        "fathom.config",
        "fathom.config.run",
    }  # ``models`` names the module itself, not a lazy name


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("fathom.rundir.writer", "run directory"),
        ("fathom.audit.cli", "commands"),
        ("fathom", "commands"),
        ("fathom.config.models", "config"),
        ("fathom.configx", None),
        ("fathom.base.io", "foundation"),
        ("fathom.basement", None),
        ("fathom.seam.pex", "model"),
        ("fathom.study.family", "analyses"),
    ],
)
def test_layer_of(module: str, layer: str | None):
    got = layer_of(module)
    assert (LAYERS[got][0] if got >= 0 else None) == layer
