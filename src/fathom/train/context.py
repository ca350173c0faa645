"""What an instrument sees at an epoch boundary (read-only by contract)."""

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
