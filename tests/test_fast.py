"""The fast path's CPU-testable parts: plans, topologies, the manual update, emulated graphs."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import synthetic_splits, tiny_config
from fathom.config import OptimConfig
from fathom.depth import DropSchedule, GateController
from fathom.errors import FathomError
from fathom.models.ciresan import CiresanMLP
from fathom.rundir import RunDir
from fathom.train.build import build_controller, build_optimizer, init_model
from fathom.train.fast import GraphStepper
from fathom.train.loop import train
from fathom.train.plan import active_parameters, plan_epoch, topology_index
from fathom.train.schedule import lr_multiplier
from fathom.train.sgd import sgd_momentum_
from fathom.train.steppers import EagerStepper, make_stepper


def test_plan_draws_the_same_gates_as_eager_sampling():
    model = CiresanMLP(widths=(16, 12, 10, 8, 6), recipe="sd_constant", in_features=20)
    sched = DropSchedule("constant", (0.1, 0.2, 0.3, 0.4))
    a = GateController(model.branches(), sched, seed=3)
    b = GateController(model.branches(), sched, seed=3)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    plan = plan_epoch(1, 100, 32, g1, a, OptimConfig(lr=0.1))
    perm = torch.randperm(100, generator=g2)
    kept = [b.sample(0) for _ in range(4)]
    assert torch.equal(plan.perm, perm)
    assert plan.kept == kept and plan.steps == 4
    assert plan.gain_values[0] == tuple(
        (1 / (1 - p)) if k else 0.0 for k, p in zip(kept[0], (0.1, 0.2, 0.3, 0.4))
    )


def test_topology_indexing_and_active_parameters():
    for i in range(16):  # bit l of the index <=> branch l kept
        assert topology_index(tuple(bool(i >> b & 1) for b in range(4))) == i
    assert topology_index((True, False, True, False)) == 0b0101
    model = CiresanMLP(widths=(16, 12, 10, 8, 6), recipe="sd_constant", in_features=20)
    ctrl = GateController(model.branches(), DropSchedule("constant", (0.1,) * 4), seed=0)
    active = active_parameters(model, ctrl, (True, False, True, False))
    skipped = {id(p) for b in (model.blocks[1], model.blocks[3]) for p in b.parameters()}
    assert len(active) == len(list(model.parameters())) - 4
    assert not skipped & {id(p) for p in active}


def test_lr_multiplier_is_piecewise_linear():
    sched = ((0, 0.0), (1, 1.0), (5, 0.0))
    assert lr_multiplier(None, 3.0) == 1.0
    assert lr_multiplier(sched, 0.5) == pytest.approx(0.5)
    assert lr_multiplier(sched, 3.0) == pytest.approx(0.5)
    assert lr_multiplier(sched, 9.0) == 0.0


@pytest.mark.parametrize("wd", [0.0, 5e-4])
def test_manual_sgd_matches_torch_sgd(wd):
    torch.manual_seed(0)
    ps = [torch.randn(7, 5), torch.randn(5)]
    ref = [p.clone().requires_grad_() for p in ps]
    opt = torch.optim.SGD(ref, lr=0.05, momentum=0.9, weight_decay=wd, foreach=True)
    mine, bufs, mine_t, bufs_t = [p.clone() for p in ps], None, [p.clone() for p in ps], None
    for _ in range(4):
        grads = [torch.randn_like(p) for p in ps]
        for r, g in zip(ref, grads):
            r.grad = g.clone()
        opt.step()
        if bufs is None:  # torch's first-step rule: b = d
            d = [g + wd * p for g, p in zip(grads, mine)] if wd else [g.clone() for g in grads]
            bufs = [x.clone() for x in d]
            torch._foreach_add_(mine, bufs, alpha=-0.05)
            d_t = [g + wd * p for g, p in zip(grads, mine_t)] if wd else [g.clone() for g in grads]
            bufs_t = [x.clone() for x in d_t]
            torch._foreach_sub_(mine_t, torch._foreach_mul(bufs_t, torch.tensor(0.05)))
        else:
            sgd_momentum_(mine, grads, bufs, 0.05, 0.9, wd)
            sgd_momentum_(mine_t, grads, bufs_t, torch.tensor(0.05), 0.9, wd)
    for r, m, mt in zip(ref, mine, mine_t):
        assert torch.equal(r.detach(), m)  # Python-float lr: the same kernels, bit for bit
        assert torch.allclose(r.detach(), mt, rtol=1e-6, atol=1e-7)  # device lr: within rounding


@pytest.mark.parametrize(
    ("recipe", "impl"),
    [
        ("sd_constant", "foreach"),
        ("sd_decreasing", "foreach"),
        ("residual", "foreach"),
        ("plain", "foreach"),
        ("sd_constant", "fused"),
        ("plain", "fused"),
    ],
)
def test_emulated_graph_stepper_equals_eager_stepper(recipe, impl):
    cfg = tiny_config(
        **{
            "model.recipe": recipe,
            "optim.epochs": 2,
            "optim.weight_decay": 1e-4,
            "optim.impl": impl,
        }
    )
    splits = synthetic_splits(n_fit=200, n_eval=16)
    device = torch.device("cpu")
    results = []
    for kind in ("eager", "graph"):
        model = init_model(cfg)
        controller = build_controller(model, cfg)
        opt = build_optimizer(model, cfg.optim)
        gen = torch.Generator().manual_seed(9)
        stepper = (
            EagerStepper(model, opt, controller, splits, device, "fp32")
            if kind == "eager"
            else GraphStepper(
                model, opt, controller, splits, device, "fp32", emulate=True, fused=impl == "fused"
            )
        )
        losses = []
        for epoch in (1, 2):
            plan = plan_epoch(epoch, 200, cfg.optim.batch_size, gen, controller, cfg.optim)
            losses.append(stepper.run_epoch(plan).item())
        results.append((copy.deepcopy(model.state_dict()), losses, opt))
    (sa, la, oa), (sb, lb, ob) = results
    assert la == lb
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    bufs_a = [oa.state[p].get("momentum_buffer") for p in oa.param_groups[0]["params"]]
    bufs_b = [ob.state[p].get("momentum_buffer") for p in ob.param_groups[0]["params"]]
    for a, b in zip(bufs_a, bufs_b):
        assert (a is None and b is None) or torch.equal(a, b)


def test_stepper_choice_and_refusal():
    cfg = tiny_config()
    model = init_model(cfg)
    opt = build_optimizer(model, cfg.optim)
    splits = synthetic_splits(n_fit=64, n_eval=8)
    stepper, note = make_stepper(cfg, model, opt, None, splits, torch.device("cpu"))
    assert stepper.name == "eager" and note is None
    with pytest.raises(FathomError, match="needs a CUDA device"):
        make_stepper(
            cfg.with_updates({"execution.path": "graph"}),
            model,
            opt,
            None,
            splits,
            torch.device("cpu"),
        )


def test_stop_at_test_target_is_labelled(tmp_path):
    splits = synthetic_splits(n_fit=256, n_eval=128)
    cfg = tiny_config(
        **{
            "optim.epochs": 6,
            "stop.target_test_acc": 0.7,
            "optim.lr": 0.02,
            "model.recipe": "residual",
        }
    )
    res = train(cfg, tmp_path / "r", splits=splits)
    m = RunDir(res.run_dir).manifest
    assert res.status == "complete" and res.epochs_completed < 6
    assert "monitored on the test set" in m["status_reason"]
    assert (
        m["stop"]["epoch"] == res.epochs_completed and m["final"]["epoch"] == res.epochs_completed
    )
    assert res.history[-1]["test/acc"] >= 0.7
    assert all(r["test/acc"] < 0.7 for r in res.history[:-1])


def test_fused_sgd_survives_a_branch_skipped_on_the_first_step():
    """torch's fused SGD fails when a parameter first gets a gradient after step one."""
    cfg = tiny_config(**{"model.recipe": "sd_constant", "optim.impl": "fused"})
    ref_cfg = tiny_config(**{"model.recipe": "sd_constant", "optim.impl": "foreach"})
    x, y = torch.rand(8, 784) * 255, torch.randint(0, 10, (8,))
    states = []
    for c in (cfg, ref_cfg):
        model = init_model(c)
        opt = build_optimizer(model, c.optim)
        ctrl = build_controller(model, c)
        for mask in [(1, 0, 1, 0), (1, 1, 1, 1), (0, 1, 0, 1)]:
            ctrl.apply_mask(mask)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        states.append(model.state_dict())
    for k in states[0]:
        assert torch.allclose(states[0][k], states[1][k], rtol=1e-5, atol=1e-6), k


def test_fused_manual_update_matches_torch_fused_sgd():
    torch.manual_seed(1)
    ps = [torch.randn(6, 4), torch.randn(4)]
    ref = [p.clone().requires_grad_() for p in ps]
    opt = torch.optim.SGD(ref, lr=0.03, momentum=0.9, weight_decay=1e-3, fused=True)
    from fathom.train.build import init_momentum_buffers

    init_momentum_buffers(opt)
    mine, bufs = [p.clone() for p in ps], [torch.zeros_like(p) for p in ps]
    for _ in range(3):
        grads = [torch.randn_like(p) for p in ps]
        for r, g in zip(ref, grads):
            r.grad = g.clone()
        opt.step()
        sgd_momentum_(mine, grads, bufs, torch.tensor(0.03), 0.9, 1e-3, fused=True)
    for r, m in zip(ref, mine):
        assert torch.equal(r.detach(), m)


def test_too_many_branches_for_graphs_falls_back_to_eager_with_a_note():
    cfg = tiny_config(**{"model.recipe": "sd_constant", "execution.max_graph_branches": 3})
    model = init_model(cfg)
    opt = build_optimizer(model, cfg.optim)
    ctrl = build_controller(model, cfg)
    splits = synthetic_splits(n_fit=64, n_eval=8)
    # the choice is made before anything touches the device, so a CUDA device object is enough
    stepper, note = make_stepper(cfg, model, opt, ctrl, splits, torch.device("cuda"))
    assert stepper.name == "eager"
    assert "2**4 topologies" in note and "running eagerly" in note


def test_update_norm_takes_the_plans_rate_on_both_paths():
    """The rate travels on one channel, the plan: neither SGD path writes it into
    ``group["lr"]`` (left at the base rate), and the update norm given the plan's last rate is
    ``lr_last * ||buf||`` on both (the base rate would be off by 1/m(t))."""
    from fathom.telemetry import params as P

    sched = {"kind": "piecewise", "points": [[0, 1.0], [2, 0.15]]}
    cfg = tiny_config(**{"model.recipe": "sd_constant", "optim.epochs": 2, "optim.schedule": sched})
    splits = synthetic_splits(n_fit=96, n_eval=8)
    device = torch.device("cpu")
    seen = {}
    for kind in ("eager", "graph"):
        model = init_model(cfg)
        controller = build_controller(model, cfg)
        opt = build_optimizer(model, cfg.optim)
        gen = torch.Generator().manual_seed(4)
        stepper = (
            EagerStepper(model, opt, controller, splits, device, "fp32")
            if kind == "eager"
            else GraphStepper(model, opt, controller, splits, device, "fp32", emulate=True)
        )
        for epoch in (1, 2):
            plan = plan_epoch(epoch, 96, cfg.optim.batch_size, gen, controller, cfg.optim)
            stepper.run_epoch(plan)
            assert opt.param_groups[0]["lr"] == cfg.optim.lr != plan.lrs[-1]
        w = next(model.parameters())  # the stem: updated at every step
        buf = opt.state[w]["momentum_buffer"]
        expected = plan.lrs[-1] * buf.double().norm().item()
        seen[kind] = P.sgd_last_update_norm(w, opt, plan.lrs[-1])
        assert seen[kind] == pytest.approx(expected, rel=1e-6)
    assert seen["graph"] == pytest.approx(seen["eager"], rel=1e-6)
