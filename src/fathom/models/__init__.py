"""Model zoo: the Ciresan residual MLP and staged conv nets (ANN and spiking)."""

from fathom.models.ciresan import RECIPES, CiresanMLP, Recipe, recipe_spec

__all__ = ["RECIPES", "CiresanMLP", "Recipe", "recipe_spec"]
