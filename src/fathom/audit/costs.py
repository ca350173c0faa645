"""Measured cost of each reduced network: FLOPs counted by torch, never hand formulas.

For mask ``m`` the model runs once on ``x`` in dense evaluation mode with the removed
branches not computed (:func:`fathom.depth.branch_mask`), under
:class:`torch.utils.flop_counter.FlopCounterMode`::

    flops_m = sum over the ops torch counts (mm, addmm, bmm, convolution, attention, ...)
    macs_m  = flops_m / (2 * batch)          (one multiply-accumulate = 2 FLOPs; per example)

torch counts matrix products and convolutions (``2 * m * n * k`` for an ``[m, k] @ [k, n]``
product; an ``addmm`` bias is not counted); elementwise work (activations, BatchNorm in eval,
pooling, the crop bypass) is not counted. A spiking net's timesteps fold into the batch and
are counted.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fathom.audit.masks import enumerate_masks, removable_branch_count
from fathom.depth import branch_mask, dense_eval
from fathom.errors import FathomError


def check_masks(model: nn.Module, masks: np.ndarray | None) -> np.ndarray:
    """``masks`` as ``uint8 [M, k]`` for the ``k`` branches of ``model`` (all ``2^k`` if None)."""
    k = removable_branch_count(model)
    if masks is None:
        return enumerate_masks(k)
    masks = np.asarray(masks)
    if masks.ndim != 2 or masks.shape[1] != k or masks.shape[0] == 0:
        raise FathomError(
            f"masks of shape {list(masks.shape)} do not fit {type(model).__name__}, which has "
            f"{k} SkippableResidual branches; pass an array [masks, {k}] of 0/1 (or None for all)"
        )
    if not np.isin(masks, (0, 1)).all():
        raise FathomError("mask entries must be 0 (branch removed) or 1 (kept)")
    return masks.astype(np.uint8)


@torch.no_grad()
def mask_costs(model: nn.Module, x: torch.Tensor, masks: np.ndarray | None = None) -> np.ndarray:
    """FLOPs (``int64 [M]``) of one forward of the batch ``x`` under each mask.

    ``masks`` defaults to every mask (:func:`fathom.audit.masks.enumerate_masks` order);
    pass ``x[:1]`` for the cost of one example. See the module docstring for what is counted.
    """
    masks = check_masks(model, masks)
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] == 0:
        raise FathomError("mask_costs needs a batch x of at least one example (e.g. x[:1])")
    out = np.zeros(masks.shape[0], dtype=np.int64)
    with dense_eval(model):
        for m, row in enumerate(masks):
            counter = FlopCounterMode(display=False)
            with branch_mask(model, tuple(int(b) for b in row)), counter:
                model(x)
            out[m] = int(counter.get_total_flops())
    return out


def mask_macs(model: nn.Module, masks: np.ndarray, x: torch.Tensor) -> list[int]:
    """Multiply-accumulates per example of each reduced network: ``flops_m / (2 * batch)``."""
    flops = mask_costs(model, x[:1], masks)
    return [int(f) // 2 for f in flops]
