"""What a config names, without torch: depths, input normalizations, each model kind's
hidden widths (recipes: :mod:`fathom.config.recipes`).

Config validation (``fathom validate``, a study's recipe list, a depth-scaling preset) checks
names against these tables; importing this module costs no torch, so commands that only
validate stay fast. The modules that build networks read the same tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fathom.config.models import STAGES, check_stage_depth
from fathom.errors import FathomError

if TYPE_CHECKING:
    from fathom.config.models import GPTConfig, ModelConfig, StagedConvConfig

NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
"""Per-channel ``(mean, std)`` of each dataset's training pixels in [0, 1]."""


def blocks_per_stage_for_depth(depth: int, stages: int = STAGES) -> int:
    """``depth / stages``, or a :class:`FathomError` naming the valid depths
    (:func:`fathom.config.models.check_stage_depth`)."""
    return check_stage_depth(depth, stages) // stages


def scaled_widths(widths: tuple[int, ...], width_mult: float) -> tuple[int, ...]:
    """``max(1, round(w · width_mult))`` for every width; ``width_mult`` must be positive."""
    if width_mult <= 0:
        raise FathomError(f"width_mult must be positive, got {width_mult}")
    return tuple(max(1, round(w * width_mult)) for w in widths)


STAGED_CONV_WIDTHS: tuple[int, ...] = (64, 128, 256, 512)
"""The staged conv net's channels per stage at ``width_mult = 1``."""


# -- each model kind's hidden widths (its row's ``widths``, fathom.config.model_kinds) --------
def ciresan_widths(cfg: ModelConfig) -> tuple[int, ...]:
    """The ``ciresan`` kind's hidden widths, as :class:`~fathom.models.ciresan.CiresanMLP`
    makes them: ``max(1, round(w · width_mult))`` of each ``cfg.widths``."""
    return scaled_widths(tuple(cfg.widths), cfg.width_mult)


def staged_conv_widths(cfg: StagedConvConfig) -> tuple[int, ...]:
    """The ``staged_conv`` kind's stage widths, as
    :class:`~fathom.models.convnet.StagedConvNet` makes them: ``max(1, round(w ·
    width_mult))`` of each of :data:`STAGED_CONV_WIDTHS`."""
    return scaled_widths(STAGED_CONV_WIDTHS, cfg.width_mult)


def gpt_widths(cfg: GPTConfig) -> tuple[int, ...]:
    """The ``gpt`` kind's hidden widths: the residual stream's ``width`` at each of its
    ``layers`` blocks (each block's MLP is ``4 · width`` inside it)."""
    return (cfg.width,) * cfg.layers


@dataclass(frozen=True)
class DataShape:
    """What a model is built for, from the data (:func:`fathom.models.build_model` fills the
    fields its kind's ``shape`` asks for, the others ``None``): the number of classes, the
    flattened input size, one example's shape, the dataset (a conv net's normalization)."""

    classes: int | None
    in_features: int | None
    input_shape: tuple[int, ...] | None
    dataset: str | None
