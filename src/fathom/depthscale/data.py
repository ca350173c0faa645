"""Images for the depth-scaling benchmark: 32×32 inputs, normalization, CIFAR augmentation.

* MNIST / Fashion-MNIST (``[N, 28, 28]`` uint8) are zero-padded by 2 pixels on every side
  to ``[N, 1, 32, 32]``; no augmentation (a flipped digit is another symbol).
* CIFAR-10 / CIFAR-100 (``[N, 3, 32, 32]`` uint8): the standard augmentation, applied to
  the fitting batches only: zero-pad 4 pixels, take a random 32×32 crop, flip horizontally
  with probability 1/2 (one independent draw per image, from the augmentation generator).
* Then ``x = (pixel / 255 - mean_c) / std_c`` with the per-channel training-set moments below.
"""

from __future__ import annotations

import torch
from torch import nn

from fathom.errors import FathomError

IMAGE_SIZE = 32
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
AUGMENTED = ("cifar10", "cifar100")
AUGMENTATION = "pad 4 + random 32x32 crop + horizontal flip p=0.5 (CIFAR fitting batches only)"


def check_dataset(name: str) -> None:
    if name not in NORMALIZATION:
        raise FathomError(
            f"the depth-scaling benchmark has no image recipe for dataset {name!r}; "
            f"use one of {', '.join(NORMALIZATION)}"
        )


def channels(name: str) -> int:
    check_dataset(name)
    return len(NORMALIZATION[name][0])


def to_32(x: torch.Tensor, name: str) -> torch.Tensor:
    """uint8 images -> ``[N, C, 32, 32]`` uint8 (MNIST-like padded by 2), or a clear error."""
    check_dataset(name)
    if x.dim() == 3 and tuple(x.shape[1:]) == (28, 28) and channels(name) == 1:
        return nn.functional.pad(x, (2, 2, 2, 2)).unsqueeze(1)
    if x.dim() == 4 and tuple(x.shape[1:]) == (channels(name), IMAGE_SIZE, IMAGE_SIZE):
        return x
    raise FathomError(
        f"{name} images shaped {list(x.shape[1:])} cannot be fed to the staged conv net, which "
        f"takes {channels(name)}×32×32 (28×28 MNIST-like images are padded); check the data files"
    )


def normalize(x: torch.Tensor, name: str) -> torch.Tensor:
    """``(x / 255 - mean_c) / std_c`` as float32, ``x`` uint8 ``[N, C, 32, 32]``."""
    mean, std = (torch.tensor(v, device=x.device).view(1, -1, 1, 1) for v in NORMALIZATION[name])
    return (x.float() / 255 - mean) / std


def crop_flip(x: torch.Tensor, generator: torch.Generator, pad: int = 4) -> torch.Tensor:
    """Random ``pad``-pixel-shifted crop and horizontal flip per image (uint8 or float).

    Draws (from ``generator``, on the CPU): two offsets in ``[0, 2 * pad]`` and one flip bit
    per image.
    """
    n, c, h, w = x.shape
    padded = nn.functional.pad(x, (pad, pad, pad, pad))
    offsets = torch.randint(0, 2 * pad + 1, (2, n), generator=generator).to(x.device)
    flips = torch.rand(n, generator=generator).lt(0.5).to(x.device)
    rows = offsets[0, :, None] + torch.arange(h, device=x.device)  # [N, H]
    cols = offsets[1, :, None] + torch.arange(w, device=x.device)  # [N, W]
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    idx_n = torch.arange(n, device=x.device)[:, None, None, None]
    idx_c = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[idx_n, idx_c, rows[:, None, :, None], cols[:, None, None, :]]


class ImagePrep(nn.Module):
    """uint8 dataset images -> normalized ``[N, C, 32, 32]`` float (for evaluation helpers)."""

    def __init__(self, dataset: str) -> None:
        super().__init__()
        check_dataset(dataset)
        self.dataset = dataset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return normalize(to_32(x, self.dataset), self.dataset)

    def extra_repr(self) -> str:
        return f"dataset={self.dataset}"
