"""Image inputs for conv nets: zero-pad to a square size, then normalize per channel.

``x -> (pad(x) / 255 - mean_c) / std_c`` for uint8 images of a registered dataset (the
moments below are the training sets' per-channel pixel moments); uint8 images of a user's
dataset become ``pad(x) / 255``; float images are only padded (taken as already
normalized). A thin module over
:func:`prepare_images`, so that every consumer (training step, evaluation, audit,
curvature) feeds the network the same tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from fathom.data.augment import as_nchw, pad_to
from fathom.errors import FathomError
from fathom.models.specs import NORMALIZATION


def prepare_images(
    x: torch.Tensor, size: int, mean: torch.Tensor | None, std: torch.Tensor | None
) -> torch.Tensor:
    """``[N, (C,) H, W]`` -> float ``[N, C, size, size]``; uint8 pixels normalized by mean/std."""
    x = pad_to(as_nchw(x), size)
    if x.dtype != torch.uint8:
        return x.float()
    if mean is None or std is None:
        return x.float() / 255
    if mean.numel() != x.shape[1]:
        raise FathomError(
            f"images have {x.shape[1]} channels but the dataset's normalization has "
            f"{mean.numel()}; check the data files"
        )
    return (x.float() / 255 - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


class ImageInput(nn.Module):
    """``net(prepare_images(x))``: the dataset's image preparation in front of ``net``.

    ``prep(x)`` is the network's input; ``net`` is reachable for instruments that walk the
    network's own blocks (``lyapunov_blocks``, ``neurons``).
    """

    def __init__(self, net: nn.Module, dataset: str | None, size: int = 32) -> None:
        super().__init__()
        self.net, self.size, self.dataset = net, size, dataset
        mean, std = NORMALIZATION.get(dataset or "", (None, None))
        self.register_buffer("mean", None if mean is None else torch.tensor(mean), persistent=False)
        self.register_buffer("std", None if std is None else torch.tensor(std), persistent=False)

    def prep(self, x: torch.Tensor) -> torch.Tensor:
        return prepare_images(x, self.size, self.mean, self.std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.prep(x))

    def extra_repr(self) -> str:
        return f"dataset={self.dataset}, size={self.size}"


def network_and_input(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor]:
    """The network an instrument should walk and its prepared input (identity without prep)."""
    if isinstance(model, ImageInput):
        return model.net, model.prep(x)
    return model, x
