"""Conv-net image inputs: MNIST padding and normalization, CIFAR crop-and-flip, bad sizes."""

from __future__ import annotations

import pytest
import torch

from fathom.data import random_crop_flip
from fathom.errors import FathomError
from fathom.models.prep import ImageInput, network_and_input, prepare_images


def test_mnist_is_zero_padded_to_32_then_normalized():
    x = torch.randint(1, 255, (2, 28, 28), dtype=torch.uint8)
    mean, std = torch.tensor([0.1307]), torch.tensor([0.3081])
    z = prepare_images(x, 32, mean, std)
    assert z.shape == (2, 1, 32, 32) and z.dtype == torch.float32
    inner = z[:, 0, 2:30, 2:30].double() * 0.3081 + 0.1307
    assert torch.allclose(inner, x.double() / 255, atol=1e-6)
    assert z[0, 0, 0, 0].item() == pytest.approx(-0.1307 / 0.3081, rel=1e-6)


def test_image_input_feeds_the_net_prepared_images_and_exposes_it():
    seen = []
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 2))
    net.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    model = ImageInput(net, "cifar10")
    x = torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8)
    model(x)
    got_net, got_x = network_and_input(model, x)
    assert got_net is net and torch.equal(got_x, seen[0])
    assert (
        not model.state_dict().keys()
        - net.state_dict().keys()
        - {f"net.{k}" for k in net.state_dict()}
    )


def test_float_user_images_are_only_padded():
    x = torch.randn(3, 1, 30, 30)
    z = prepare_images(x, 32, None, None)
    assert torch.equal(z[:, :, 1:31, 1:31], x)


def test_crop_flip_is_a_shifted_window_possibly_mirrored():
    g = torch.Generator().manual_seed(0)
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).view(2, 3, 32, 32) + 1
    out = random_crop_flip(x, g)
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


def test_sizes_the_model_cannot_take():
    with pytest.raises(FathomError, match="do not fit in 32x32"):
        prepare_images(torch.zeros(2, 3, 36, 36, dtype=torch.uint8), 32, None, None)
    mean, std = torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0.2, 0.2, 0.2])
    with pytest.raises(FathomError, match="1 channels but the dataset's normalization has 3"):
        prepare_images(torch.zeros(2, 28, 28, dtype=torch.uint8), 32, mean, std)
    raw = torch.full((1, 28, 28), 51, dtype=torch.uint8)
    assert prepare_images(raw, 32, None, None)[0, 0, 2, 2].item() == pytest.approx(0.2)
