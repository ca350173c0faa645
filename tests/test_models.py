"""The Ciresan MLP: parameter count, crop shapes, recipes, taps, MACs."""

from __future__ import annotations

import pytest
import torch

from ciresan_reference import forward_taps, macs_per_example
from fathom.config.recipes import RECIPES
from fathom.errors import FathomError
from fathom.models import count_parameters
from fathom.models.ciresan import CiresanMLP


def test_full_width_parameter_count():
    assert count_parameters(CiresanMLP(recipe="residual")) == 11_972_510
    assert count_parameters(CiresanMLP(recipe="plain")) == 11_972_510


def test_crop_shapes_and_forward():
    model = CiresanMLP(widths=(40, 30, 20, 10, 5), recipe="residual", in_features=784)
    x = torch.randint(0, 256, (3, 28, 28), dtype=torch.uint8)
    logits, taps = forward_taps(model, x)
    assert logits.shape == (3, 10)
    assert [tuple(a.shape) for a, _ in taps] == [
        (3, 784),
        (3, 40),
        (3, 30),
        (3, 20),
        (3, 10),
        (3, 5),
    ]
    assert [tuple(z.shape) for _, z in taps] == [
        (3, 40),
        (3, 30),
        (3, 20),
        (3, 10),
        (3, 5),
        (3, 10),
    ]
    assert torch.allclose(logits, model(x))
    # the crop keeps the first out_features coordinates
    assert model.blocks[0].res.bypass(torch.arange(40.0)[None]).tolist() == [list(range(30))]


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_every_recipe_gets_gradient_everywhere(recipe):
    torch.manual_seed(0)
    model = CiresanMLP(widths=(16, 12, 10, 8, 6), recipe=recipe, in_features=20)
    out = model(torch.rand(7, 20) * 255)
    assert out.shape == (7, 10) and torch.isfinite(out).all()
    out.square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_output_relu_and_input_scale():
    torch.manual_seed(0)
    m = CiresanMLP(widths=(8, 6), output_relu=True, in_features=4, input_scale=0.5)
    x = torch.tensor([[2.0, 4.0, 6.0, 8.0]])
    assert (m(x) >= 0).all()
    assert torch.allclose(m.prepare(x), x * 0.5)


def test_macs_count_by_hand():
    m = CiresanMLP(widths=(10, 8, 6, 4, 2), recipe="residual", in_features=12)
    stem, head = 12 * 10, 2 * 10
    body = [10 * 8, 8 * 6, 6 * 4, 4 * 2]
    assert macs_per_example(m) == stem + head + sum(body)
    assert macs_per_example(m, (1, 0, 0, 1)) == stem + head + body[0] + body[3]
    full = CiresanMLP(recipe="residual")
    assert full.affine_layers()[1].in_features * full.affine_layers()[1].out_features == 5_000_000


def test_bad_architecture_is_refused():
    with pytest.raises(FathomError, match="non-increasing"):
        CiresanMLP(widths=(10, 20), recipe="residual")
    with pytest.raises(FathomError, match="unknown recipe"):
        CiresanMLP(recipe="nope")
    with pytest.raises(FathomError, match="width_mult"):
        CiresanMLP(width_mult=0)
