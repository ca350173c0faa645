"""StagedConvNet: exact parameter counts, shapes, gradients everywhere, bad input."""

from __future__ import annotations

import pytest
import torch

from fathom.errors import FathomError
from fathom.models import count_parameters
from fathom.models.convnet import StagedConvNet
from fathom.models.specs import blocks_per_stage_for_depth

torch.set_num_threads(1)

CIFAR100_COUNTS = {4: 1_756_836, 8: 4_892_196, 12: 8_027_556, 16: 11_162_916, 20: 14_298_276}


@pytest.mark.parametrize("depth", sorted(CIFAR100_COUNTS))
def test_cifar100_parameter_counts_match_the_log(depth):
    model = StagedConvNet(blocks_per_stage=blocks_per_stage_for_depth(depth), classes=100)
    assert model.depth == depth
    assert count_parameters(model) == CIFAR100_COUNTS[depth]
    ann = StagedConvNet(blocks_per_stage=depth // 4, classes=100, neuron="relu")
    assert count_parameters(ann) == CIFAR100_COUNTS[depth]


VARIANTS = [
    pytest.param(dict(neuron="relu", residual=False, batchnorm=True), id="ann"),
    pytest.param(dict(neuron="lif", timesteps=3, residual=False, batchnorm=True), id="lif"),
    pytest.param(dict(neuron="lif", timesteps=2, residual=True, batchnorm=True), id="lif-res"),
    pytest.param(dict(neuron="relu", residual=True, batchnorm=False), id="ann-res-nobn"),
    pytest.param(dict(neuron="lif", timesteps=0), id="lif-T0-is-ann"),
]


@pytest.mark.parametrize("kw", VARIANTS)
def test_every_variant_gets_gradients_in_every_parameter(kw):
    torch.manual_seed(0)
    model = StagedConvNet(blocks_per_stage=2, classes=7, width_mult=1 / 16, in_channels=1, **kw)
    x = torch.randn(3, 1, 32, 32) * 2
    logits = model(x)
    assert logits.shape == (3, 7)
    assert torch.isfinite(logits).all()
    logits.square().sum().backward()
    missing = [
        n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0
    ]
    assert missing == []


def test_spiking_blocks_emit_binary_spikes_and_no_state_between_batches():
    torch.manual_seed(0)
    model = StagedConvNet(blocks_per_stage=1, classes=5, width_mult=1 / 16, timesteps=4).eval()
    x = torch.randn(4, 3, 32, 32)
    h = model.encode(x)
    assert h.shape == (16, 3, 32, 32)
    h = model.blocks[0](h)
    assert set(h.unique().tolist()) <= {0.0, 1.0}
    out = model(x)
    assert torch.equal(model(x), out)
    torch.testing.assert_close(model(x[2:]), out[2:], rtol=0, atol=1e-6)


def test_residual_blocks_are_the_equal_width_ones():
    model = StagedConvNet(blocks_per_stage=3, classes=10, width_mult=1 / 16, residual=True)
    assert [b.residual for b in model.blocks] == [False, True, True] * 4
    plain = StagedConvNet(blocks_per_stage=3, classes=10, width_mult=1 / 16)
    assert count_parameters(model) == count_parameters(plain)


def test_bad_input_is_named_with_a_fix():
    with pytest.raises(FathomError, match="multiple of the 4 stages"):
        blocks_per_stage_for_depth(10)
    with pytest.raises(FathomError, match="timesteps must be >= 0"):
        StagedConvNet(timesteps=-1)
    with pytest.raises(FathomError, match="image size 28"):
        StagedConvNet(image_size=28)
    model = StagedConvNet(classes=10, width_mult=1 / 16, in_channels=1, neuron="relu")
    with pytest.raises(FathomError, match=r"expects images shaped \[B, 1, 32, 32\]"):
        model(torch.zeros(2, 1, 28, 28))
    with pytest.raises(FathomError, match="unknown neuron"):
        StagedConvNet(neuron="tanh")
