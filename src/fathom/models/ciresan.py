"""The Ciresan-style tapered MLP with crop residual bypasses.

Architecture (full width): ``784 -> 2500 -> 2000 -> 1500 -> 1000 -> 500 -> 10``,
11,972,510 parameters. A stem affine+ReLU, four body blocks, a linear classifier::

    h = relu(stem(x))
    h = relu(crop(h) + gain * linear(h))      # each of the four body blocks (residual recipes)
    h = relu(linear(h))                       # body blocks of the ``plain`` recipe
    logits = head(h)                          # linear logits (``output_relu=True``: relu(head(h)))

``crop`` keeps the first ``out_features`` coordinates (the widths only narrow, so no
projection is needed); ``gain`` is that of :class:`fathom.depth.SkippableResidual`:
``kept / survival`` in training, one at evaluation, ``{0, 1}`` for explicit masks. The
trainer draws the gates ahead (:class:`fathom.depth.GateController`, the recipe's schedule);
in a plain loop the branches draw their own, once their probabilities are set, e.g.
``set_drop_probs(model, recipe_schedule(model.recipe, epochs).at(epoch))``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fathom.config.models import (
    ModelConfig,
    check_hidden_widths,
    check_narrowing,
    check_unit_dropout,
)
from fathom.config.recipes import Recipe, recipe_spec
from fathom.depth import Crop, DropSchedule, SkippableResidual, find_branches
from fathom.models.specs import DataShape, scaled_widths

FULL_WIDTHS: tuple[int, ...] = (2500, 2000, 1500, 1000, 500)


def recipe_schedule(recipe: Recipe, epochs: int) -> DropSchedule:
    """The drop schedule of a residual recipe; ``linear_decrease`` reaches 0 at the last epoch."""
    end = float(max(epochs - 1, 1)) if recipe.schedule_kind == "linear_decrease" else None
    return DropSchedule(recipe.schedule_kind, recipe.drop_probs, end)


class CiresanBlock(nn.Module):
    """``relu(crop(h) + gain * linear(h))`` (residual) or ``relu(linear(h))`` (plain)."""

    def __init__(self, d_in: int, d_out: int, residual: bool, unit_dropout: float) -> None:
        super().__init__()
        self.residual = residual
        linear = nn.Linear(d_in, d_out)
        if residual:
            check_narrowing((d_in, d_out))
            self.res = SkippableResidual(linear, Crop(d_out))
        else:
            self.res = linear
        self.dropout = nn.Dropout(unit_dropout) if unit_dropout > 0 else nn.Identity()

    @property
    def linear(self) -> nn.Linear:
        return self.res.branch if self.residual else self.res

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.dropout(F.relu(self.res(h)))


class CiresanMLP(nn.Module):
    """Ciresan tapered MLP; see the module docstring for the exact computation."""

    def __init__(
        self,
        widths: tuple[int, ...] = FULL_WIDTHS,
        classes: int = 10,
        recipe: str = "residual",
        input_scale: float = 1 / 255,
        output_relu: bool = False,
        width_mult: float = 1.0,
        in_features: int = 784,
        unit_dropout: float | None = None,
    ) -> None:
        super().__init__()
        spec = recipe_spec(recipe)
        self.recipe = spec
        self.input_scale = float(input_scale)
        self.output_relu = output_relu
        self.widths = scaled_widths(check_hidden_widths(tuple(widths)), width_mult)
        p_unit = check_unit_dropout(spec.unit_dropout if unit_dropout is None else unit_dropout)
        if spec.residual:  # the config's check, in its order, on the same (unscaled) widths
            check_narrowing(tuple(widths))
        self.stem = nn.Linear(in_features, self.widths[0])
        self.stem_dropout = nn.Dropout(p_unit) if p_unit > 0 else nn.Identity()
        self.blocks = nn.ModuleList(
            CiresanBlock(a, b, spec.residual, p_unit)
            for a, b in zip(self.widths[:-1], self.widths[1:], strict=True)
        )
        self.head = nn.Linear(self.widths[-1], classes)

    # -- the computation --------------------------------------------------------------
    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 or float images -> flat float features scaled by ``input_scale``."""
        dtype = self.stem.weight.dtype
        return x.reshape(x.shape[0], -1).to(dtype) * self.input_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem_dropout(F.relu(self.stem(self.prepare(x))))
        for block in self.blocks:
            h = block(h)
        logits = self.head(h)
        return F.relu(logits) if self.output_relu else logits

    # -- structure ----------------------------------------------------------------------
    def affine_layers(self) -> list[nn.Linear]:
        """Every affine layer, in order: stem, body blocks, head."""
        return [self.stem, *(b.linear for b in self.blocks), self.head]

    def branches(self) -> list[SkippableResidual]:
        return find_branches(self)

    def extra_repr(self) -> str:
        return f"recipe={self.recipe.name}, widths={self.widths}, input_scale={self.input_scale:.6g}, output_relu={self.output_relu}"


def build(cfg: ModelConfig, shape: DataShape) -> CiresanMLP:
    """The ``ciresan`` kind's builder (:mod:`fathom.config.model_kinds`)."""
    assert shape.classes is not None and shape.in_features is not None
    return CiresanMLP(
        widths=cfg.widths,
        classes=shape.classes,
        recipe=cfg.recipe,
        input_scale=cfg.input_scale,
        output_relu=cfg.output_relu,
        width_mult=cfg.width_mult,
        in_features=shape.in_features,
        unit_dropout=cfg.unit_dropout,
    )


def drop_schedule(cfg: ModelConfig, epochs: int) -> DropSchedule | None:
    """The recipe's drop schedule (``model.drop_probs`` overrides its probabilities); ``None``
    for a plain recipe or one whose probabilities are all zero."""
    spec = recipe_spec(cfg.recipe)
    if not spec.residual:
        return None
    schedule = recipe_schedule(spec, epochs)
    if cfg.drop_probs is not None:
        kind = spec.schedule_kind if spec.schedule_kind != "none" else "constant"
        end = schedule.end_epoch if kind == "linear_decrease" else None
        schedule = DropSchedule(kind, tuple(cfg.drop_probs), end)
    if schedule.kind == "none" or not any(schedule.probs):
        return None
    return schedule
