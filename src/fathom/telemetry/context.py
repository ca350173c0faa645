"""What an instrument sees at an epoch boundary (read-only by contract).

The trainer builds one per observation (``fathom.train.session.Session.context``); it lives
here, with the instruments that read it, so that telemetry never imports the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from fathom.depth import GateController

if TYPE_CHECKING:
    from fathom.config import RunConfig
    from fathom.data import DataSplits


@dataclass
class EpochContext:
    """State at the boundary after ``epoch`` epochs (epoch 0 = before the first step).

    Instruments must leave every field exactly as they found it: parameters, ``.grad``
    tensors, optimizer state, gate gains, module train/eval flags and every RNG.
    """

    epoch: int
    step: int
    model: nn.Module
    optimizer: torch.optim.Optimizer
    controller: GateController | None
    splits: DataSplits
    initial_params: dict[str, torch.Tensor]
    device: torch.device
    config: RunConfig
    lr: float | None = None
    """The rate the epoch's last step applied (``plan.lrs[-1]``: the plan, the one source of
    the learning rate; ``None`` at epoch 0). Update ratios use it, not ``param_group["lr"]``."""
