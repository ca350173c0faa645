"""The eager step's SGD over active parameters: bit-identical to torch's step, same semantics."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from conftest import synthetic_splits, tiny_config
from fathom.depth import SkippableResidual
from fathom.train.build import build_controller, build_optimizer, init_model
from fathom.train.plan import plan_epoch
from fathom.train.sgd import ActiveSGD, plain_sgd_blocker
from fathom.train.steppers import EagerStepper


def _train(cfg, active: bool, epochs=(1, 2, 3)):
    splits = synthetic_splits(n_fit=160, n_eval=8)
    model = init_model(cfg)
    controller = build_controller(model, cfg)
    opt = build_optimizer(model, cfg.optim)
    stepper = EagerStepper(model, opt, controller, splits, torch.device("cpu"), "fp32")
    assert (stepper.sgd is not None) == (cfg.optim.impl == "foreach" and cfg.optim.name == "sgd")
    if not active:
        stepper.sgd = None  # torch's own backward / step / zero_grad
    gen = torch.Generator().manual_seed(5)
    losses, kept = [], []
    for epoch in epochs:
        plan = plan_epoch(epoch, 160, cfg.optim.batch_size, gen, controller, cfg.optim)
        losses.append(stepper.run_epoch(plan).item())
        kept += plan.kept
    bufs = [opt.state[p].get("momentum_buffer") for p in model.parameters()]
    return copy.deepcopy(model.state_dict()), losses, bufs, kept, opt


@pytest.mark.parametrize(
    ("recipe", "wd", "momentum"),
    [
        ("sd_constant", 1e-4, 0.9),
        ("sd_decreasing", 0.0, 0.9),
        ("residual", 1e-4, 0.9),
        ("plain", 0.0, 0.9),
        ("sd_constant", 1e-4, 0.0),
    ],
)
def test_active_sgd_is_bit_identical_to_torch_sgd_step(recipe, wd, momentum):
    cfg = tiny_config(
        **{"model.recipe": recipe, "optim.weight_decay": wd, "optim.momentum": momentum}
    )
    (sa, la, ba, kept, oa), (sb, lb, bb, _, ob) = _train(cfg, True), _train(cfg, False)
    assert la == lb
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    for a, b in zip(ba, bb, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    # the same optimizer state entries (checkpoints and resume state read them)
    assert len(oa.state) == len(ob.state)
    if recipe == "sd_constant" and momentum:
        assert any(not all(k) for k in kept)  # some branch was skipped on some step


def test_skipped_branch_gets_no_update_and_no_momentum():
    cfg = tiny_config(**{"model.recipe": "sd_constant", "optim.weight_decay": 1e-3})
    model = init_model(cfg)
    opt = build_optimizer(model, cfg.optim)
    sgd = ActiveSGD(model, opt, build_controller(model, cfg))
    x, y = torch.rand(8, 784) * 255, torch.randint(0, 10, (8,))
    skipped = model.blocks[1].linear
    before = [p.detach().clone() for p in skipped.parameters()]
    for b, g in zip(model.branches(), (2.0, 0.0, 1.5, 1.25), strict=True):
        b.gain = g
    for _ in range(3):
        sgd.step(nn.functional.cross_entropy(model(x), y), (True, False, True, True), 0.1)
    for p, b in zip(skipped.parameters(), before, strict=True):
        assert torch.equal(p, b) and p.grad is None and "momentum_buffer" not in opt.state[p]
    assert all(p.grad is None for p in model.parameters())  # nothing accumulated
    assert len(sgd.params((True, False, True, True))) == len(list(model.parameters())) - 2


def test_a_branch_that_skips_itself_is_left_out():
    """A self-sampling branch (no controller) that drops itself gives no gradient: skipped."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), SkippableResidual(nn.Linear(5, 5), p=0.5, seed=1))
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, foreach=True)
    sgd = ActiveSGD(model, opt)
    x = torch.randn(4, 6)
    for _ in range(6):
        sgd.step(model(x).square().mean(), (), 0.1)
        ref(x).square().mean().backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("updates", "reason"),
    [
        ({"optim.name": "adamw"}, "not torch.optim.SGD"),
        ({"optim.nesterov": True}, "Nesterov"),
        ({"optim.impl": "fused"}, "foreach"),
        ({"optim.impl": "for-loop"}, "foreach"),
    ],
)
def test_other_optimizers_keep_torchs_step(updates, reason):
    cfg = tiny_config(**updates)
    model = init_model(cfg)
    opt = build_optimizer(model, cfg.optim)
    assert reason in plain_sgd_blocker(opt, model)
    splits = synthetic_splits(n_fit=32, n_eval=8)
    assert EagerStepper(model, opt, None, splits, torch.device("cpu")).sgd is None


def test_foreign_parameter_lists_and_hooks_keep_torchs_step():
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD([model.weight], lr=0.1, momentum=0.9, foreach=True)
    assert "not model.parameters()" in plain_sgd_blocker(opt, model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    assert plain_sgd_blocker(opt, model) is None
    opt.register_step_post_hook(lambda *a: None)
    assert "hooks" in plain_sgd_blocker(opt, model)
