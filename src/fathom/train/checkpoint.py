"""Model state for checkpoints; the file formats live in :mod:`fathom.rundir.files`."""

from __future__ import annotations

import torch

from fathom.rundir.files import load_resume, load_weights, save_resume, save_weights

__all__ = ["cpu_state", "load_resume", "load_weights", "save_resume", "save_weights"]


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached, contiguous CPU copy of ``model.state_dict()``."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
