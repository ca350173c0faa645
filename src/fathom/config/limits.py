"""The largest sizes a config accepts: beyond them a value is a typo, not an experiment.

``epochs = 1e12`` (a float, refused by the strict integer fields anyway) or ``fit_subset =
10000000000`` would otherwise validate and fail, or run for ever, later. Each bound is far
above any run this toolkit makes (the largest shipped protocol trains 150 epochs on 50,000
examples with 512 channels) and is named in the refusal (``optim.epochs: Input should be
less than or equal to 100000``). Torch-free and pydantic-free.
"""

from __future__ import annotations

MAX_EPOCHS = 100_000
"""Epochs of a run (``optim.epochs``, a depth-scaling ``epochs``) and every epoch period
(``eval.every``, ``telemetry.every``, ``health.every``, ``checkpoints.resume_every``)."""

MAX_EXAMPLES = 1_000_000_000
"""Examples in a split, a subset, a batch or a probe (``data.fit_subset``, ``eval_subset``,
``val_size``, ``test_size``, ``optim.batch_size``, ``eval.batch_size``, probe sizes)."""

MAX_WIDTH = 1_048_576
"""Units of one hidden layer, after ``width_mult`` (``model.widths``)."""

MAX_WIDTH_MULT = 1024.0
"""``model.width_mult``, the factor on every width."""

MAX_LAYERS = 10_000
"""Layers of a model (the number of ``model.widths``, a staged conv net's ``depth``)."""

MAX_TIMESTEPS = 10_000
"""LIF simulation steps per input (``model.timesteps``)."""

MAX_IMAGE_SIZE = 8192
"""Side of the (padded) input image of a staged conv net (``model.image_size``)."""

SEED_BOUND = 2**63
"""Seeds lie in ``[-SEED_BOUND, SEED_BOUND)`` (a 64-bit generator seed); split seeds, which
index a permutation, in ``[0, SEED_BOUND)``."""
