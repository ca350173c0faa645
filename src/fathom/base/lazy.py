"""Lazy package exports (PEP 562): ``import fathom.data`` costs nothing until a name is used.

A package ``__init__`` that re-exports names from heavy submodules (torch, numpy) declares
them instead of importing them::

    __getattr__, __dir__, __all__ = exports(__name__, {"fathom.data.splits": ["DataSplits"]})

``fathom.data.DataSplits`` and ``from fathom.data import DataSplits`` import
``fathom.data.splits`` on first use and cache the name in the package. This keeps
``fathom <command> --help`` from importing torch: a command's ``cli`` module can be imported
without its package's heavy submodules.

A package that is the face of one module (``fathom.config``: every name of
``fathom.config.run``) forwards to it instead: ``__getattr__, __dir__ = forward(__name__,
"fathom.config.run")``. ``tests/test_structure.py`` reads both tables, so an import of a name
through a package counts as an import of the module that defines it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def exports(
    package: str, names: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``; ``names``: module -> exported names."""
    where = {name: module for module, listed in names.items() for name in listed}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__, sorted(where)


def forward(package: str, module: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: every name of ``module`` on first use."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            value = getattr(importlib.import_module(module), name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *vars(importlib.import_module(module))})

    return __getattr__, __dir__
