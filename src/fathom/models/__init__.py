"""Model zoo: the Ciresan residual MLP and staged conv nets (ANN and spiking)."""

from fathom.models.ciresan import RECIPES, CiresanMLP, Recipe, recipe_spec
from fathom.models.convnet import StagedConvNet
from fathom.models.neurons import LIF

__all__ = ["LIF", "RECIPES", "CiresanMLP", "Recipe", "StagedConvNet", "recipe_spec"]
