"""Config families by manifest ``kind``: the reader picks the validator from this table.

Validators are named by import path so that this low layer imports no package above it.
``depth_scaling`` is read only: the depth-scaling runner wrote manifests of that kind (formats
1 and 2, before it wrote ``run`` directories); no writer produces it now, and old run
directories that carry it still open, their config read as recorded.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from fathom.errors import FathomError

Validator = Callable[[dict[str, Any], str], Any]

_VALIDATORS: dict[str, str | Validator] = {
    "run": "fathom.config:validate_run_config",
    "depth_scaling": "fathom.rundir.kinds:raw_config",
}


def raw_config(data: dict[str, Any], origin: str = "config") -> dict[str, Any]:
    """The config as recorded (a kind without a validated config type)."""
    return dict(data)


def config_validator(kind: str) -> Validator:
    """The validator of ``kind``, or a FathomError listing the known kinds."""
    if kind not in _VALIDATORS:
        raise FathomError(
            f"unknown run kind {kind!r}; known kinds: {', '.join(sorted(_VALIDATORS))}. "
            "The run directory was written by a newer or another tool"
        )
    target = _VALIDATORS[kind]
    if callable(target):
        return target
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)
