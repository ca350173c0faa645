"""The training recipes, by name: one table, read by config validation (``model.recipe``, a
study's recipe list) and by the model builders (architecture switches, drop schedule).

Torch-free and pydantic-free, so that validating a config imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass

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
