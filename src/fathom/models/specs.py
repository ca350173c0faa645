"""What a config names, without torch: recipes, depths, input normalizations.

Config validation (``fathom validate``, a study's recipe list, a depth-scaling preset) checks
names against these tables; importing this module costs no torch, so commands that only
validate stay fast. The modules that build networks read the same tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from fathom.config_models import STAGES, check_stage_depth
from fathom.errors import FathomError


@dataclass(frozen=True)
class Recipe:
    """One training recipe: architecture switches and its drop schedule."""

    name: str
    residual: bool
    unit_dropout: float
    schedule_kind: str  # none | constant | linear_decrease
    drop_probs: tuple[float, ...]


RECIPES: dict[str, Recipe] = {
    "plain": Recipe("plain", residual=False, unit_dropout=0.0, schedule_kind="none", drop_probs=()),
    "residual": Recipe("residual", True, 0.0, "none", (0.0, 0.0, 0.0, 0.0)),
    "residual_dropout": Recipe("residual_dropout", True, 0.2, "none", (0.0, 0.0, 0.0, 0.0)),
    "sd_constant": Recipe("sd_constant", True, 0.0, "constant", (0.1, 0.2, 0.3, 0.4)),
    "sd_decreasing": Recipe("sd_decreasing", True, 0.0, "linear_decrease", (0.2, 0.4, 0.6, 0.8)),
}


def recipe_spec(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise FathomError(f"unknown recipe {name!r}; valid recipes: {', '.join(RECIPES)}") from None


NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
"""Per-channel ``(mean, std)`` of each dataset's training pixels in [0, 1]."""


def blocks_per_stage_for_depth(depth: int, stages: int = STAGES) -> int:
    """``depth / stages``, or a :class:`FathomError` naming the valid depths
    (:func:`fathom.config_models.check_stage_depth`)."""
    return check_stage_depth(depth, stages) // stages


def scaled_widths(widths: tuple[int, ...], width_mult: float) -> tuple[int, ...]:
    """``max(1, round(w · width_mult))`` for every width; ``width_mult`` must be positive."""
    if width_mult <= 0:
        raise FathomError(f"width_mult must be positive, got {width_mult}")
    return tuple(max(1, round(w * width_mult)) for w in widths)
