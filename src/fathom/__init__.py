"""Fathom: train deep networks with the instruments on.

``fathom.Instruments`` (probe telemetry of any model), ``fathom.load_run`` /
``fathom.load_study`` (verified run and study directories in a notebook,
:mod:`fathom.export.notebook`) and every package (``fathom.rundir``, ``fathom.audit``, ...)
are loaded on first use, so ``import fathom`` (and ``fathom --help``) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Instruments": ("fathom.telemetry.instruments", "Instruments"),
    "load_run": ("fathom.export.notebook", "load_run"),
    "load_study": ("fathom.export.notebook", "load_study"),
}
_SUBMODULES = (
    "audit",
    "config",
    "curvature",
    "data",
    "depth",
    "dynamics",
    "export",
    "models",
    "report",
    "rundir",
    "seam",
    "stats",
    "study",
    "telemetry",
)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"fathom.{name}")
    raise AttributeError(f"module 'fathom' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, *_SUBMODULES])
