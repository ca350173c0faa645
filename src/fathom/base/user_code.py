"""A user's callable named ``"package.module:function"`` (a model or a dataset factory),
imported and called with errors that say why it failed and what to set.

A factory named in a config is code: importing it runs it. A config read from a shared run
directory names a factory the user did not write; it is imported only from the user's own
path. A module that would be found inside a run or study directory
(:func:`fathom.base.io.fathom_tree`, e.g. because the working directory is on ``sys.path``
under ``python -m fathom`` and is a run directory someone shared) is refused by name, before
anything of it runs (:func:`check_origin`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fathom.base.io import fathom_tree
from fathom.errors import FathomError


def resolve_factory(path: str, key: str) -> Callable[..., Any]:
    """Import ``package.module`` and return its callable ``function``, or a clear error."""
    module_name, _, attr = path.partition(":")
    check_origin(module_name, path, key)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise FathomError(
            f"{key} = {path!r}: cannot import module {module_name!r} ({e}); check the spelling "
            "and that the module is on PYTHONPATH (or installed)"
        ) from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise FathomError(
            f"{key} = {path!r}: module {module_name!r} has no attribute {attr!r}; "
            f"available: {', '.join(n for n in dir(module) if not n.startswith('_')) or 'none'}"
        )
    if not callable(fn):
        raise FathomError(f"{key} = {path!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def check_origin(module_name: str, path: str, key: str) -> None:
    """Refuse to import ``module_name`` when its top-level package would be found inside a
    run or study directory. Finding the top-level package runs none of its code; a module
    already imported is the user's own."""
    top = module_name.split(".")[0]
    if not top or top in sys.modules:
        return
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return  # the import below says what is wrong
    where = (
        None
        if spec is None
        else spec.origin or next(iter(spec.submodule_search_locations or []), None)
    )
    tree = fathom_tree(where) if where and Path(where).exists() else None
    if tree is not None:
        raise FathomError(
            f"{key} = {path!r}: module {top!r} would be imported from {where!r}, inside the run "
            f"or study directory {str(tree)!r}. A run directory is data, never code: a module "
            "found there (a shared run directory on sys.path, e.g. the working directory under "
            "`python -m fathom`) is not imported. Put the factory's module in your own code "
            "(installed, or on PYTHONPATH outside every run and study directory), read it, and "
            "run from another working directory"
        )


def call_factory(path: str, kwargs: dict[str, Any], key: str) -> Any:
    """``function(**kwargs)``; a ``TypeError`` from a wrong keyword names the keywords."""
    fn = resolve_factory(path, key)
    try:
        return fn(**kwargs)
    except TypeError as e:
        raise FathomError(
            f"{key} = {path!r} failed with keyword arguments {sorted(kwargs)}: {e}; "
            "set the function's arguments in the config's kwargs table"
        ) from None
