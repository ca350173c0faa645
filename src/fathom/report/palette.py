"""One colour per recipe, used by every figure and by report.html (Okabe-Ito, colour-blind safe)."""

from __future__ import annotations

from collections.abc import Iterable

_PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")


def recipe_colours(recipes: Iterable[str]) -> dict[str, str]:
    """``recipe -> colour``: the palette in sorted recipe order, so a recipe keeps its colour
    in every figure of one report (and across reports of studies with the same recipes)."""
    return {r: _PALETTE[i % len(_PALETTE)] for i, r in enumerate(sorted(set(recipes)))}
