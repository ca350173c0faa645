"""Fathom: train deep networks with the instruments on."""

__version__ = "0.1.0"
