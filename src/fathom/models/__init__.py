"""Model zoo by ``model.kind``: the Ciresan MLP, staged conv / LIF nets, a user's factory.

:func:`build_model` is the one place a config becomes a module; the trainer, the run
directory reader, the audit and the curvature commands all call it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fathom.base.lazy import exports

if TYPE_CHECKING:
    from torch import nn

    from fathom.config.models import ModelConfig, PythonModelConfig, StagedConvConfig

__getattr__, __dir__, _names = exports(
    __name__,
    {
        "fathom.models.ciresan": ["CiresanMLP"],
        "fathom.models.convnet": ["StagedConvNet"],
        "fathom.models.neurons": ["LIF"],
        "fathom.config.recipes": ["RECIPES", "Recipe", "recipe_spec"],
    },
)
__all__ = [*_names, "build_model", "count_parameters"]


def count_parameters(model: nn.Module) -> int:
    """``sum_p numel(p)`` over ``model.parameters()`` (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters())


def build_model(
    cfg: ModelConfig | StagedConvConfig | PythonModelConfig,
    classes: int | None = None,
    in_features: int | None = None,
    *,
    input_shape: tuple[int, ...] | None = None,
    dataset: str | None = None,
) -> nn.Module:
    """The module of ``cfg`` (freshly initialised from torch's global RNG).

    ``input_shape`` is one example's shape (``(28, 28)``, ``(3, 32, 32)``); the MLP needs
    only ``in_features`` = its product, the conv net the channel count. ``dataset`` picks
    the conv net's input normalization (:mod:`fathom.models.prep`). A value not given is
    the registered ``dataset``'s (:func:`fathom.data.registry.registered_shape`); for any
    other data it is refused, never MNIST's.
    """
    if cfg.kind == "python":
        from fathom.models.factory import build_python_model

        return build_python_model(cfg.factory, dict(cfg.kwargs))
    from fathom.data.registry import registered_shape

    if classes is None:
        classes = registered_shape(dataset, "classes")[0]
    if cfg.kind == "ciresan":
        from fathom.models.ciresan import CiresanMLP

        if in_features is None:
            shape = input_shape or registered_shape(dataset, "in_features")[1]
            in_features = math.prod(shape)
        return CiresanMLP(
            widths=cfg.widths,
            classes=classes,
            recipe=cfg.recipe,
            input_scale=cfg.input_scale,
            output_relu=cfg.output_relu,
            width_mult=cfg.width_mult,
            in_features=in_features,
            unit_dropout=cfg.unit_dropout,
        )
    from fathom.models.convnet import StagedConvNet
    from fathom.models.prep import ImageInput
    from fathom.models.specs import blocks_per_stage_for_depth

    shape = tuple(input_shape or registered_shape(dataset, "input_shape")[1])
    net = StagedConvNet(
        blocks_per_stage=blocks_per_stage_for_depth(cfg.depth),
        classes=classes,
        neuron=cfg.neuron,
        timesteps=cfg.timesteps,
        residual=cfg.residual,
        batchnorm=cfg.batchnorm,
        width_mult=cfg.width_mult,
        in_channels=shape[0] if len(shape) == 3 else 1,
        image_size=cfg.image_size,
    )
    return ImageInput(net, dataset, cfg.image_size)
