"""Stochastic depth that really skips: call counts, gradients, optimizer state, rates, gains."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fathom.depth import (
    Crop,
    DropSchedule,
    GateController,
    SkippableResidual,
    branch_mask,
    dense_eval,
    find_branches,
    huang_linear_in_depth,
)
from fathom.errors import FathomError
from fathom.models.ciresan import CiresanMLP

WIDTHS = (24, 20, 16, 12, 8)
IMPLS = [{"foreach": False}, {"foreach": True}, {"fused": True}]
IMPL_IDS = ["for-loop", "foreach", "fused"]


class CountingLinear(nn.Linear):
    """A Linear that counts forward calls and backward passes through it."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.forward_calls = 0
        self.backward_calls = 0

    def forward(self, x):
        self.forward_calls += 1
        out = super().forward(x)
        if out.requires_grad:
            out.register_hook(self._count)
        return out

    def _count(self, grad):
        self.backward_calls += 1


def _model_with_counters(seed: int = 0) -> CiresanMLP:
    torch.manual_seed(seed)
    model = CiresanMLP(widths=WIDTHS, recipe="sd_constant", in_features=16)
    for block in model.blocks:
        old = block.res.branch
        new = CountingLinear(old.in_features, old.out_features)
        new.load_state_dict(old.state_dict())
        block.res.branch = new
    return model


def test_skipped_branch_is_not_called_forward_or_backward():
    model = _model_with_counters()
    x = torch.randn(5, 16)
    mask = (1, 0, 1, 0)
    with branch_mask(model, mask):
        model(x).sum().backward()
    calls = [(b.res.branch.forward_calls, b.res.branch.backward_calls) for b in model.blocks]
    assert calls == [(1, 1), (0, 0), (1, 1), (0, 0)]


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_skipped_branch_gets_no_gradient_and_keeps_momentum_bit_identical(impl):
    model = _model_with_counters(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3, **impl)
    x, y = torch.randn(8, 16), torch.randint(0, 10, (8,))
    # one dense step so that every parameter has a momentum buffer
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    skipped = model.blocks[1].res.branch
    before_w = skipped.weight.detach().clone()
    before_buf = opt.state[skipped.weight]["momentum_buffer"].clone()
    kept = model.blocks[0].res.branch
    kept_buf = opt.state[kept.weight]["momentum_buffer"].clone()
    with branch_mask(model, (1, 0, 1, 1)):
        nn.functional.cross_entropy(model(x), y).backward()
        assert skipped.weight.grad is None and skipped.bias.grad is None
        assert kept.weight.grad is not None
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert torch.equal(skipped.weight, before_w)
    assert torch.equal(opt.state[skipped.weight]["momentum_buffer"], before_buf)
    assert not torch.equal(opt.state[kept.weight]["momentum_buffer"], kept_buf)


def test_gains_in_training_and_evaluation():
    torch.manual_seed(0)
    branch = nn.Linear(6, 4)
    res = SkippableResidual(branch, Crop(4))
    x = torch.randn(3, 6)
    res.gain = 1 / (1 - 0.3)
    assert torch.allclose(res(x), x[:, :4] + branch(x) / 0.7)
    res.gain = 0.0
    assert torch.equal(res(x), x[:, :4])
    model = CiresanMLP(widths=WIDTHS, recipe="sd_constant", in_features=16)
    ctrl = GateController(model.branches(), DropSchedule("constant", (0.1, 0.2, 0.3, 0.4)), seed=3)
    for _ in range(20):
        kept = ctrl.sample(0)
        for k, p, g in zip(kept, (0.1, 0.2, 0.3, 0.4), ctrl.gains(), strict=True):
            assert g == (1 / (1 - p) if k else 0.0)
    with dense_eval(model):
        assert all(b.decide() == 1.0 for b in find_branches(model))
        assert not model.training
    assert model.training
    assert ctrl.gains() == tuple(b.gain for b in find_branches(model))  # left as drawn


def test_empirical_drop_rates_match_schedule():
    model = CiresanMLP(widths=WIDTHS, recipe="sd_constant", in_features=16)
    probs = (0.1, 0.2, 0.3, 0.4)
    ctrl = GateController(model.branches(), DropSchedule("constant", probs), seed=7)
    n = 20000
    drops = torch.zeros(4)
    for _ in range(n):
        drops += torch.tensor([0.0 if k else 1.0 for k in ctrl.sample(0)])
    rate = drops / n
    for r, p in zip(rate.tolist(), probs, strict=True):
        assert abs(r - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_linear_decrease_schedule_and_huang_rule():
    s = DropSchedule("linear_decrease", (0.2, 0.4, 0.6, 0.8), end_epoch=99)
    assert s.at(0) == (0.2, 0.4, 0.6, 0.8)
    assert s.at(99) == (0.0, 0.0, 0.0, 0.0)
    assert s.at(49.5) == pytest.approx((0.1, 0.2, 0.3, 0.4))
    assert huang_linear_in_depth(4, 0.5) == (0.125, 0.25, 0.375, 0.5)


def test_explicit_masks_are_gain_one_and_restore():
    torch.manual_seed(0)
    model = CiresanMLP(widths=WIDTHS, recipe="residual", in_features=16).eval()
    x = torch.randn(4, 16)
    with branch_mask(model, (1, 1, 1, 1)):
        full = model(x)
    assert torch.equal(full, model(x))
    with branch_mask(model, (0, 0, 0, 0)):
        h = torch.relu(model.stem(model.prepare(x)))
        for w in WIDTHS[1:]:
            h = torch.relu(h[:, :w])
        assert torch.allclose(model(x), model.head(h))
    assert all(b.mask is None and b.gain is None for b in model.branches())


def test_bad_probabilities_and_masks_are_refused():
    with pytest.raises(FathomError, match=r"outside \[0, 1\)"):
        DropSchedule("constant", (0.1, 1.0))
    with pytest.raises(FathomError, match="outside"):
        DropSchedule("constant", (-0.1,))
    model = CiresanMLP(widths=WIDTHS, recipe="residual", in_features=16)
    with pytest.raises(FathomError, match="mask has 2 entries"), branch_mask(model, (1, 0)):
        pass
    with pytest.raises(FathomError, match="4 skippable branches"):
        GateController(model.branches(), DropSchedule("constant", (0.1,)), seed=0)
