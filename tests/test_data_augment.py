"""Padding and crop-and-flip augmentation against per-example loop references."""

from __future__ import annotations

import pytest
import torch

from fathom.data.augment import pad_to, random_crop_flip
from fathom.errors import FathomError


def test_pad_to_centres_mnist_in_32():
    x = torch.randint(1, 256, (3, 28, 28), dtype=torch.uint8)
    y = pad_to(x, 32)
    assert y.shape == (3, 1, 32, 32) and y.dtype == torch.uint8
    assert torch.equal(y[:, 0, 2:30, 2:30], x)
    assert int(y.sum()) == int(x.sum())


def test_pad_to_rejects_images_that_do_not_fit():
    with pytest.raises(FathomError, match="do not fit in 28x28"):
        pad_to(torch.zeros(1, 3, 32, 32, dtype=torch.uint8), 28)


def reference_crop_flip(x, dy, dx, f, pad):
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    h, w = x.shape[-2:]
    out = torch.empty_like(x)
    for n in range(x.shape[0]):
        crop = padded[n, :, dy[n] : dy[n] + h, dx[n] : dx[n] + w]
        out[n] = crop.flip(-1) if f[n] else crop
    return out


def test_random_crop_flip_matches_loop_reference():
    x = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)
    pad = 2
    out = random_crop_flip(x, torch.Generator().manual_seed(5), pad=pad)
    g = torch.Generator().manual_seed(5)
    dy = torch.randint(0, 2 * pad + 1, (16,), generator=g)
    dx = torch.randint(0, 2 * pad + 1, (16,), generator=g)
    f = torch.randint(0, 2, (16,), generator=g).bool()
    assert f.any() and (~f).any() and (dy != pad).any()
    assert torch.equal(out, reference_crop_flip(x, dy, dx, f, pad))


def test_no_pad_no_flip_is_identity_and_seed_reproduces():
    x = torch.randint(0, 256, (4, 3, 6, 6), dtype=torch.uint8)
    assert torch.equal(random_crop_flip(x, torch.Generator().manual_seed(0), pad=0, flip=False), x)
    a = random_crop_flip(x, torch.Generator().manual_seed(1))
    b = random_crop_flip(x, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    with pytest.raises(FathomError, match="padding must be >= 0"):
        random_crop_flip(x, torch.Generator(), pad=-1)
