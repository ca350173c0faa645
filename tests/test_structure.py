"""The structure rules of docs/architecture.md, enforced over ``src/fathom``.

* every function or method is at most :data:`MAX_FUNCTION_LINES` lines (``def`` to its last
  line, decorators excluded), every module at most :data:`MAX_MODULE_LINES` lines;
* no import cycle among fathom modules (module-level imports; an ``if TYPE_CHECKING:``
  block is not an import at run time);
* one direction of flow: a module imports only from its own layer or from layers before it
  in :data:`LAYERS`. This holds for imports inside functions too: a lazy import is cheaper
  at start-up, never a licence to reach upwards.

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
    (
        "foundation",
        (
            "fathom.errors",
            "fathom.io",
            "fathom.lazy",
            "fathom.provenance",
            "fathom.terminal",
            "fathom.units",
            "fathom.user_code",
        ),
    ),
    (
        "config",
        ("fathom.config", "fathom.config_models", "fathom.config_live", "fathom.config_export"),
    ),
    ("data", ("fathom.data",)),
    (
        "model",
        (
            "fathom.models",
            "fathom.depth",
            "fathom.seam",
            "fathom.seam_attribution",
            "fathom.seam_check",
            "fathom.seam_discovery",
            "fathom.seam_key",
            "fathom.seam_types",
            "fathom.pex",
            "fathom.pex_attention",
            "fathom.pex_conv",
            "fathom.pex_embedding",
            "fathom.pex_functional",
            "fathom.pex_rnn",
        ),
    ),
    ("run directory", ("fathom.rundir",)),
    ("instruments", ("fathom.telemetry", "fathom.dynamics")),
    ("trainer", ("fathom.train",)),
    (
        "analyses",
        (
            "fathom.curvature",
            "fathom.audit",
            "fathom.stats",
            "fathom.study",
            "fathom.depthscale",
            "fathom.config_family",
        ),
    ),
    ("reports/exports", ("fathom.report", "fathom.export", "fathom.reproduce")),
    ("commands", ("fathom", "fathom.cli", "fathom.__main__")),
)
"""Layers in the order of docs/architecture.md's "Import layers" (lowest first), each with
the module prefixes it holds. Every ``cli`` module of a package (``fathom.<pkg>.cli``) is a
command, whatever its package."""


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
    lazy: bool  # inside a function (or any block below module level)


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


def _import_nodes(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with ``lazy`` (not at module level), skipping TYPE_CHECKING."""
    top = {id(n) for n in tree.body}
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if _type_checking_block(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, id(node) not in top
        stack.extend(ast.iter_child_nodes(node))


def _targets(
    node: ast.Import | ast.ImportFrom, source: str, is_package: bool, known: set[str]
) -> list[str]:
    """The fathom modules an import statement loads (``from pkg import sub`` -> ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = source.split(".") if is_package else source.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != source:
            out.append(name)
    return out


def imports(root: Path) -> list[Import]:
    """Every import of one fathom module by another under ``root``."""
    known = modules(root)
    out = []
    for source, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, lazy in _import_nodes(tree):
            for target in _targets(node, source, path.name == "__init__.py", set(known)):
                out.append(Import(source, target, path, node.lineno, lazy))
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
    """Strongly connected components of more than one module (Tarjan), module-level edges."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if not e.lazy:
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
            how = "inside a function" if e.lazy else "at module level"
            out.append(
                f"{_rel(e.path)}:{e.line} {e.source} ({LAYERS[src][0]}) imports {e.target} "
                f"({LAYERS[dst][0]}) {how}"
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


def test_the_checks_catch_what_they_forbid(tmp_path: Path):
    pkg = tmp_path / "fathom"
    (pkg / "train").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("import fathom.io\n")
    (pkg / "io.py").write_text("from fathom import errors\n")  # a cycle
    (pkg / "train" / "__init__.py").write_text("")
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (pkg / "train" / "loop.py").write_text(
        "def f():\n    from fathom.report import html\n" + body + "\n"
    )
    (pkg / "report.py").write_text("\n" * MAX_MODULE_LINES + "from fathom.train import loop\n")
    edges = imports(pkg)
    assert import_cycles(edges) == [["fathom.errors", "fathom.io"]]
    violations = layer_violations(edges)
    assert len(violations) == 1
    assert (
        "fathom.train.loop (trainer) imports fathom.report (reports/exports) inside a function"
        in (violations[0])
    )
    assert [s.split(" ", 1)[1] for s in long_functions(pkg)] == [
        f"f: {MAX_FUNCTION_LINES + 2} lines"
    ]
    assert long_modules(pkg) == [f"{pkg / 'report.py'}: {MAX_MODULE_LINES + 1} lines"]


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("fathom.rundir.writer", "run directory"),
        ("fathom.audit.cli", "commands"),
        ("fathom", "commands"),
        ("fathom.config_models", "config"),
        ("fathom.configx", None),
    ],
)
def test_layer_of(module: str, layer: str | None):
    got = layer_of(module)
    assert (LAYERS[got][0] if got >= 0 else None) == layer
