"""Image-batch transforms on device-resident uint8 tensors (no host round trip).

- :func:`pad_to`: zero-pad MNIST-like ``[N, 28, 28]`` images to ``[N, 1, size, size]``,
  centred, so 28x28 data sets can feed a 32x32 convolutional net.
- :func:`random_crop_flip`: the standard CIFAR augmentation: zero-pad by ``pad`` pixels on
  every side, take a random ``H x W`` crop (offsets uniform in ``[0, 2 pad]``), and flip
  horizontally with probability 1/2; drawn per example from ``generator``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fathom.errors import FathomError


def as_nchw(x: torch.Tensor) -> torch.Tensor:
    """``[N, H, W]`` -> ``[N, 1, H, W]``; ``[N, C, H, W]`` unchanged."""
    if x.ndim == 3:
        return x.unsqueeze(1)
    if x.ndim == 4:
        return x
    raise FathomError(f"images must be [N, H, W] or [N, C, H, W], got shape {tuple(x.shape)}.")


def pad_to(x: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad images to ``size x size``, centred (extra pixel, if odd, at bottom/right)."""
    x = as_nchw(x)
    h, w = x.shape[-2:]
    if h > size or w > size:
        raise FathomError(
            f"images of {h}x{w} do not fit in {size}x{size}; the model needs inputs of at most "
            f"{size}x{size} (choose a model input size >= {max(h, w)})."
        )
    top, left = (size - h) // 2, (size - w) // 2
    return F.pad(x, (left, size - w - left, top, size - h - top))


def random_crop_flip(
    x: torch.Tensor, generator: torch.Generator, pad: int = 4, flip: bool = True
) -> torch.Tensor:
    """Per-example random crop of the ``pad``-zero-padded images, and horizontal flip.

    ``out[n, c, i, j] = padded[n, c, dy_n + i, dx_n + (W - 1 - j if f_n else j)]`` with
    ``dy_n, dx_n ~ U{0..2 pad}`` and ``f_n ~ Bernoulli(1/2)`` (``f_n = 0`` when
    ``flip=False``). ``generator`` must live on ``x``'s device.
    """
    x = as_nchw(x)
    if pad < 0:
        raise FathomError(f"crop padding must be >= 0, got {pad}.")
    n, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dev = x.device
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=dev)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=dev)
    flips = torch.randint(0, 2, (n,), generator=generator, device=dev).bool() & flip
    cols = torch.arange(w, device=dev).expand(n, w)
    cols = torch.where(flips[:, None], cols.flip(1), cols) + dx[:, None]
    rows = torch.arange(h, device=dev)[None, :] + dy[:, None]
    batch = torch.arange(n, device=dev)[:, None, None, None]
    chans = torch.arange(x.shape[1], device=dev)[None, :, None, None]
    return padded[batch, chans, rows[:, None, :, None], cols[:, None, None, :]]
