"""The audit on a model of one's own: every mask against a brute-force loop, FLOPs by counter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fathom.audit
from fathom.audit.masks import enumerate_masks
from fathom.depth import SkippableResidual
from fathom.errors import FathomError
from fathom.models.convnet import StagedConvNet

torch.set_num_threads(1)
C, SIDE, CLASSES = 3, 8, 5


class ResidualCNN(nn.Module):
    """stem conv -> BN -> relu -> [x + conv(bn(relu(conv(x))))] x 2 -> avgpool -> maxpool -> 3rd block -> head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, C, 3, padding=1), nn.BatchNorm2d(C), nn.ReLU())
        self.blocks = nn.ModuleList(
            SkippableResidual(
                nn.Sequential(
                    nn.Conv2d(C, C, 3, padding=1, bias=False),
                    nn.BatchNorm2d(C),
                    nn.ReLU(),
                    nn.Conv2d(C, C, 1),
                ),
                p=0.3,
            )
            for _ in range(3)
        )
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(C * (SIDE // 2) ** 2, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = self.blocks[1](self.blocks[0](h))
        h = self.blocks[2](self.pool(h))
        return self.head(h.flatten(1))


def residual_cnn() -> ResidualCNN:
    torch.manual_seed(0)
    model = ResidualCNN().double()
    model.train()  # non-trivial BatchNorm running statistics, then eval for the audit
    for _ in range(3):
        model(torch.randn(16, 1, SIDE, SIDE, dtype=torch.float64))
    return model


def brute_force_logits(model: ResidualCNN, x: torch.Tensor, mask: tuple[int, ...]) -> torch.Tensor:
    """The same network written out by hand, BatchNorm on running statistics, float64."""

    def bn(layer: nn.BatchNorm2d, h: torch.Tensor) -> torch.Tensor:
        scale = layer.weight / torch.sqrt(layer.running_var + layer.eps)
        return (h - layer.running_mean[:, None, None]) * scale[:, None, None] + layer.bias[
            :, None, None
        ]

    def block(i: int, h: torch.Tensor) -> torch.Tensor:
        if not mask[i]:
            return h
        conv1, norm, _, conv2 = model.blocks[i].branch
        return h + conv2(torch.relu(bn(norm, conv1(h))))

    conv, norm, _ = model.stem
    h = torch.relu(bn(norm, conv(x)))
    h = block(1, block(0, h))
    h = block(2, F.max_pool2d(h, 2))
    return model.head(h.flatten(1))


def test_every_mask_against_a_brute_force_loop():
    model = residual_cnn()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(11, 1, SIDE, SIDE, generator=g, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (11,), generator=g)
    scores = fathom.audit.evaluate_masks(model, x, y, batch_size=4)
    masks = enumerate_masks(3)
    assert np.array_equal(scores.masks, masks)
    with torch.no_grad():
        for m, row in enumerate(masks):
            ref = brute_force_logits(model, x, tuple(int(b) for b in row))
            np.testing.assert_allclose(scores.logits[m], ref.float().numpy(), rtol=1e-6, atol=1e-7)
            ref32 = torch.from_numpy(scores.logits[m]).double()
            ce = F.cross_entropy(ref32, y, reduction="none").numpy()
            np.testing.assert_allclose(scores.ce[m], ce, rtol=1e-12, atol=1e-12)
            acc = (ref.argmax(1) == y).double().mean().item()
            assert scores.accuracy()[m] == pytest.approx(acc, abs=1e-12)
    assert scores.damage()[scores.full] == 0.0
    assert model.training and all(b.mask is None for b in model.blocks)


def conv_flops(c_in: int, c_out: int, k: int, side: int) -> int:
    return 2 * c_in * c_out * k * k * side * side


def test_flop_counter_costs_of_a_residual_cnn_by_hand():
    model = residual_cnn()
    x = torch.randn(2, 1, SIDE, SIDE, dtype=torch.float64)
    costs = fathom.audit.mask_costs(model, x[:1])
    stem = conv_flops(1, C, 3, SIDE)
    head = 2 * C * (SIDE // 2) ** 2 * CLASSES
    branch = [conv_flops(C, C, 3, s) + conv_flops(C, C, 1, s) for s in (SIDE, SIDE, SIDE // 2)]
    for m, row in enumerate(enumerate_masks(3)):
        assert costs[m] == stem + head + sum(b for b, keep in zip(branch, row) if keep)
    assert np.array_equal(fathom.audit.mask_costs(model, x), 2 * costs)  # linear in the batch


def test_staged_conv_net_residual_branches_are_audited():
    torch.manual_seed(0)
    model = StagedConvNet(
        stages=2,
        widths=(4, 6),
        blocks_per_stage=2,
        classes=4,
        neuron="relu",
        timesteps=0,
        residual=True,
        in_channels=1,
        image_size=8,
    )
    x = torch.randn(5, 1, 8, 8)
    y = torch.randint(0, 4, (5,))
    scores = fathom.audit.evaluate_masks(model, x, y)
    assert scores.masks.shape == (4, 2)
    with torch.no_grad():
        np.testing.assert_allclose(scores.logits[-1], model.eval()(x).numpy(), rtol=1e-6, atol=1e-6)
    costs = fathom.audit.mask_costs(model, x[:1])
    b0, b1 = conv_flops(4, 4, 3, 8), conv_flops(6, 6, 3, 4)  # stage 1 at 8x8, stage 2 at 4x4
    assert (costs - costs[0]).tolist() == [0, b0, b1, b0 + b1]


class TupleOut(nn.Module):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.res = SkippableResidual(nn.Linear(4, 4))
        self.out = out

    def forward(self, x):
        z = self.res(x)
        return {"tuple": (z, z), "flat": z.sum(1), "int": z.argmax(1, keepdim=True)}[self.out]


def test_bad_input_is_refused_with_a_clear_error():
    model = residual_cnn()
    x = torch.randn(6, 1, SIDE, SIDE, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (6,))
    with pytest.raises(FathomError, match="6 examples but y holds 5 labels"):
        fathom.audit.evaluate_masks(model, x, y[:5])
    with pytest.raises(FathomError, match="3 SkippableResidual branches"):
        fathom.audit.evaluate_masks(model, x, y, masks=np.ones((2, 2), dtype=np.uint8))
    with pytest.raises(FathomError, match="3 SkippableResidual branches"):
        fathom.audit.mask_costs(model, x[:1], masks=np.ones((1, 4), dtype=np.uint8))
    with pytest.raises(FathomError, match="0 .branch removed. or 1"):
        fathom.audit.evaluate_masks(model, x, y, masks=np.full((1, 3), 2))
    with pytest.raises(FathomError, match="integer tensor"):
        fathom.audit.evaluate_masks(model, x, y.double())
    with pytest.raises(FathomError, match="model has 5 classes"):
        fathom.audit.evaluate_masks(model, x, y + CLASSES)
    with pytest.raises(FathomError, match="no removable branches"):
        fathom.audit.evaluate_masks(nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), x, y)
    with pytest.raises(FathomError, match="at least one example"):
        fathom.audit.mask_costs(model, x[:0])
    x4, y4 = torch.randn(3, 4), torch.zeros(3, dtype=torch.int64)
    for out, what in (("tuple", "tuple"), ("flat", r".*shape \[3\]"), ("int", "torch.int64")):
        with pytest.raises(FathomError, match=f"returned a {what}.*logits"):
            fathom.audit.evaluate_masks(TupleOut(out), x4, y4)
