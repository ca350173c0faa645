"""Benchmark images: MNIST padding, CIFAR crop-and-flip, and sizes the model cannot take."""

from __future__ import annotations

import pytest
import torch

from fathom.depthscale.data import crop_flip, normalize, to_32
from fathom.errors import FathomError


def test_mnist_is_zero_padded_to_32():
    x = torch.randint(1, 255, (2, 28, 28), dtype=torch.uint8)
    out = to_32(x, "mnist")
    assert out.shape == (2, 1, 32, 32) and out.dtype == torch.uint8
    assert torch.equal(out[:, 0, 2:30, 2:30], x)
    assert out[:, :, :2].sum() == 0 and out[:, :, :, 30:].sum() == 0
    z = normalize(out, "mnist")
    assert z[0, 0, 0, 0].item() == pytest.approx(-0.1307 / 0.3081, rel=1e-6)


def test_crop_flip_is_a_shifted_window_possibly_mirrored():
    g = torch.Generator().manual_seed(0)
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).view(2, 3, 32, 32) + 1
    out = crop_flip(x, g)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    windows = [
        (dy, dx, flip, padded[:, :, dy : dy + 32, dx : dx + 32])
        for dy in range(9)
        for dx in range(9)
        for flip in (False, True)
    ]
    for i in range(2):
        found = [
            (dy, dx, flip)
            for dy, dx, flip, w in windows
            if torch.equal(out[i], w[i].flip(-1) if flip else w[i])
        ]
        assert len(found) == 1
    g2 = torch.Generator().manual_seed(0)
    assert torch.equal(crop_flip(x, g2), out)  # seeded


def test_sizes_the_model_cannot_take():
    with pytest.raises(FathomError, match=r"cannot be fed.*3×32×32"):
        to_32(torch.zeros(2, 3, 28, 28, dtype=torch.uint8), "cifar10")
    with pytest.raises(FathomError, match="no image recipe"):
        to_32(torch.zeros(2, 28, 28, dtype=torch.uint8), "svhn")
