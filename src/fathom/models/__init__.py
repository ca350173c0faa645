"""Model zoo by ``model.kind``: the Ciresan MLP, staged conv / LIF nets, a user's factory.

:func:`build_model` is the one place a config becomes a module; the trainer, the run
directory reader, the audit and the curvature commands all call it. It builds by the kind's
row of :data:`fathom.config.model_kinds.MODEL_KINDS`, whose builders and drop schedules are
``"module:function"`` paths into this package (:func:`kind_function`).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fathom.base.lazy import exports
from fathom.errors import FathomError

if TYPE_CHECKING:
    from torch import nn

    from fathom.config.model_kinds import ModelSpec

__getattr__, __dir__, _names = exports(
    __name__,
    {
        "fathom.models.ciresan": ["CiresanMLP"],
        "fathom.models.convnet": ["StagedConvNet"],
        "fathom.models.neurons": ["LIF"],
        "fathom.config.recipes": ["RECIPES", "Recipe", "recipe_spec"],
    },
)
__all__ = [*_names, "build_model", "count_parameters", "kind_function"]


def count_parameters(model: nn.Module) -> int:
    """``sum_p numel(p)`` over ``model.parameters()`` (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters())


def kind_function(path: str) -> Callable[..., Any]:
    """The function a model kind's row names by ``"module:function"`` (the table's own rows
    name functions of this package: the model layer, which the trainer may import)."""
    module, _, name = path.partition(":")
    fn = getattr(importlib.import_module(module), name, None) if name else None
    if not callable(fn):
        raise FathomError(
            f"a model kind names {path!r}, which is no function; name it as "
            "'package.module:function' in its row of fathom.config.model_kinds.MODEL_KINDS"
        )
    return fn


def build_model(
    cfg: ModelSpec,
    classes: int | None = None,
    in_features: int | None = None,
    *,
    input_shape: tuple[int, ...] | None = None,
    dataset: str | None = None,
) -> nn.Module:
    """The module of ``cfg`` (freshly initialised from torch's global RNG), built by its kind.

    ``input_shape`` is one example's shape (``(28, 28)``, ``(3, 32, 32)``); what the kind
    takes from it is its row's ``shape``: the MLP only ``in_features`` = its product, the
    conv net the shape (its channel count), a user's factory nothing. ``dataset`` picks the
    conv net's input normalization (:mod:`fathom.models.prep`). A value not given is the
    registered ``dataset``'s (:func:`fathom.data.registry.registered_shape`); for any other
    data it is refused, never MNIST's. An unknown kind is refused naming the known ones.
    """
    from fathom.config.model_kinds import model_kind
    from fathom.models.specs import DataShape

    row = model_kind(cfg.kind)
    build = kind_function(row.builder)
    if row.shape == "none":
        return build(cfg, DataShape(None, None, None, dataset))
    from fathom.data.registry import registered_shape

    if classes is None:
        classes = registered_shape(dataset, "classes")[0]
    if row.shape == "in_features":
        if in_features is None:
            shape = input_shape or registered_shape(dataset, "in_features")[1]
            in_features = math.prod(shape)
        return build(cfg, DataShape(classes, in_features, None, dataset))
    shape = tuple(input_shape or registered_shape(dataset, "input_shape")[1])
    return build(cfg, DataShape(classes, None, shape, dataset))
