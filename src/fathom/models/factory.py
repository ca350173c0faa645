"""A user's model from ``model.factory = "package.module:function"`` (:mod:`fathom.user_code`)."""

from __future__ import annotations

from typing import Any

from torch import nn

from fathom.errors import FathomError
from fathom.user_code import call_factory


def build_python_model(path: str, kwargs: dict[str, Any]) -> nn.Module:
    """A user's ``nn.Module`` from its factory (``model.kind = "python"``)."""
    model = call_factory(path, kwargs, "model.factory")
    if not isinstance(model, nn.Module):
        raise FathomError(
            f"model.factory = {path!r} returned a {type(model).__name__}, not a torch.nn.Module; "
            "return the module itself (not a class, a tuple or a state dict)"
        )
    if not any(True for _ in model.parameters()):
        raise FathomError(f"model.factory = {path!r} returned a module without parameters")
    return model
