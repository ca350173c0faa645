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
    from collections.abc import Sequence

    from torch import nn

    from fathom.config.model_kinds import ModelSpec
    from fathom.config.run import RunConfig
    from fathom.depth import DropSchedule

__getattr__, __dir__, _names = exports(
    __name__,
    {
        "fathom.models.ciresan": ["CiresanMLP"],
        "fathom.models.convnet": ["StagedConvNet"],
        "fathom.models.neurons": ["LIF"],
        "fathom.config.recipes": ["RECIPES", "Recipe", "recipe_spec"],
    },
)
__all__ = [
    *_names,
    "build_model",
    "convention_at_checkpoint",
    "count_parameters",
    "drop_schedule",
    "kind_function",
    "set_depth_convention",
]


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


def drop_schedule(cfg: ModelSpec, epochs: int) -> DropSchedule | None:
    """The drop schedule of a model config trained for ``epochs`` (its kind's
    ``drop_schedule`` row: the Ciresan recipes, a ``python`` model's ``drop_probs``), or
    ``None`` for a kind that has none."""
    from fathom.config.model_kinds import model_kind

    row = model_kind(cfg.kind)
    return None if row.drop_schedule is None else kind_function(row.drop_schedule)(cfg, epochs)


def set_depth_convention(
    model: nn.Module, convention: str, probs: Sequence[float] | None = None
) -> None:
    """Every :class:`~fathom.depth.SkippableResidual` of ``model`` scaled by ``convention``
    (``run.depth.convention``), and given ``probs`` (one per branch, in module order) its
    drop probability ``p``: what ``huang`` weights a branch by in ``eval()`` and under masks."""
    from fathom.depth import find_branches, set_drop_probs
    from fathom.depth.residual import check_convention

    check_convention(convention)
    for b in find_branches(model):
        b.convention = convention
    if probs is not None:
        set_drop_probs(model, probs)


def convention_at_checkpoint(model: nn.Module, run: RunConfig, epoch: int) -> None:
    """A model rebuilt from a run's checkpoint of ``epoch``: the run's convention, and each
    branch's ``p`` as it trained in that epoch (the schedule at ``max(epoch - 1, 0)``, the
    draws of epoch ``e`` being made at ``e - 1``), so the audit and the curvature weight a
    ``huang`` branch by the survival it trained with. ``inverse`` (the default) is left as
    built: its evaluation gain is one whatever ``p``."""
    if run.depth.convention == "inverse":
        return
    schedule = drop_schedule(run.model, run.optim.epochs)
    probs = None if schedule is None else schedule.at(max(epoch - 1, 0))
    set_depth_convention(model, run.depth.convention, probs)
