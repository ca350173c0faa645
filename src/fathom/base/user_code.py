"""A user's callable named ``"package.module:function"`` (a model or a dataset factory),
imported and called with errors that say why it failed and what to set.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from fathom.errors import FathomError


def resolve_factory(path: str, key: str) -> Callable[..., Any]:
    """Import ``package.module`` and return its callable ``function``, or a clear error."""
    module_name, _, attr = path.partition(":")
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
