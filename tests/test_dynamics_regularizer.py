"""The Lyapunov regularizer: formula, separate gradients, and λ_reg = 0 bit-identity."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fathom.base.io import state_dict_digest
from fathom.dynamics.lyapunov import model_lyapunov
from fathom.dynamics.regularizer import global_norm, lyapunov_penalty, regularized_gradients
from fathom.models.convnet import StagedConvNet

torch.set_num_threads(1)


def test_penalty_hand_value():
    assert lyapunov_penalty(torch.tensor([0.1, -0.3]), -0.1).item() == pytest.approx(0.04)


def tiny(seed: int = 0, **kw) -> StagedConvNet:
    torch.manual_seed(seed)
    return StagedConvNet(blocks_per_stage=1, classes=4, width_mult=1 / 16, in_channels=1, **kw)


def batches(n: int = 3):
    g = torch.Generator().manual_seed(5)
    return [
        (torch.randn(6, 1, 32, 32, generator=g), torch.randint(0, 4, (6,), generator=g))
        for _ in range(n)
    ]


@pytest.mark.parametrize(
    "kw", [dict(neuron="relu"), dict(neuron="lif", timesteps=2)], ids=["ann", "lif"]
)
def test_zero_weight_reproduces_vanilla_bit_for_bit(kw):
    vanilla = tiny(**kw)
    opt = torch.optim.SGD(vanilla.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(vanilla(x), y).backward()
        opt.step()
    reg = tiny(**kw)
    opt = torch.optim.SGD(reg.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(9)
    for x, y in batches():
        opt.zero_grad(set_to_none=True)
        rec = regularized_gradients(reg, x, y, weight=0.0, sub_batch=3, measure=True, generator=gen)
        assert rec.penalty is not None and rec.grad_norm_penalty is None
        opt.step()
    assert state_dict_digest(reg.state_dict()) == state_dict_digest(vanilla.state_dict())


def test_positive_weight_gradient_is_ce_plus_weighted_penalty():
    model = tiny(neuron="lif", timesteps=2)
    ref_model = copy.deepcopy(model)
    x, y = batches(1)[0]
    rec = regularized_gradients(
        model,
        x,
        y,
        weight=0.3,
        target=-0.1,
        sub_batch=2,
        generator=torch.Generator().manual_seed(1),
    )
    got = [p.grad.clone() for p in model.parameters()]
    # reference: one scalar loss, same order (the CE pass updates BatchNorm's running
    # statistics, which the eval-mode Lyapunov pass then uses), same tangents, one backward
    ce = F.cross_entropy(ref_model(x), y)
    est = model_lyapunov(ref_model, x[:2], generator=torch.Generator().manual_seed(1))
    (ce + 0.3 * lyapunov_penalty(est.maximal, -0.1)).backward()
    for g, p in zip(got, ref_model.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert rec.penalty.item() == pytest.approx(lyapunov_penalty(est.maximal, -0.1).item(), rel=1e-6)
    assert rec.grad_norm_penalty > 0 and rec.grad_norm_ce > 0
    assert rec.grad_norm_total.item() == pytest.approx(global_norm(got).item(), rel=1e-6)
    assert rec.correct.item() == (ref_model(x).argmax(1) == y).sum().item()
