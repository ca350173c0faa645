"""Stochastic depth that really skips: call counts, gradients, optimizer state, rates, gains."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn

from ciresan_reference import forward_taps
from fathom.base.io import state_dict_digest
from fathom.depth import (
    Crop,
    DropSchedule,
    GateController,
    SkippableResidual,
    branch_mask,
    dense_eval,
    find_branches,
    huang_linear_in_depth,
    set_drop_probs,
)
from fathom.depth.residual import _OUTSIDE_COMPILE, _uniform
from fathom.errors import FathomError
from fathom.models.ciresan import CiresanMLP
from fathom.rundir.weights import cpu_state, load_cpu_state
from fathom.train.build import init_momentum_buffers

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


# ---------------------------------------------------------------------------------------
# The self-sampling module: drops by itself in train(), dense in eval(), state in state_dict
# ---------------------------------------------------------------------------------------


class CountingBranch(nn.Linear):
    """A Linear that counts its forward calls."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


def _own(p: float, seed: int | None = 0) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 5),
        SkippableResidual(CountingBranch(5, 5), p=p, seed=seed),
        nn.Linear(5, 3),
    )


def _decisions(res: SkippableResidual, n: int) -> list[bool]:
    """Kept (True) or dropped on each of ``n`` training forwards, read off the call count."""
    x, out = torch.randn(2, 5), []
    for _ in range(n):
        before = res.branch.calls
        res(x)
        out.append(res.branch.calls > before)
    return out


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_self_sampling_drop_rate_and_gain_follow_p(p):
    res = SkippableResidual(CountingBranch(5, 5), p=p, seed=11)
    n = 4000
    dropped = n - sum(_decisions(res, n))
    assert abs(dropped / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    x = torch.randn(3, 5)
    outs = {tuple(res(x).flatten().tolist()) for _ in range(40)}
    kept = x + res.branch(x) * (1.0 / (1.0 - p))
    assert outs == {tuple(x.flatten().tolist()), tuple(kept.flatten().tolist())}


def test_eval_is_dense_right_after_training_forwards_and_outside_gains():
    model = _own(0.6)
    res = model[1]
    x = torch.randn(4, 6)
    for _ in range(5):
        model(x)
    res.gain = 0.0  # what a controller leaves after a drawn step
    model.eval()
    h = model[0](x)
    dense = model[2](h + res.branch(h))
    assert torch.equal(model(x), dense)
    model.train()
    assert torch.equal(model(x), model[2](h))  # the outside gain applies in train() only
    res.gain = None
    assert set(_decisions(res, 60)) == {True, False}  # back to its own draws


def test_outside_gains_take_precedence_over_own_draws():
    model = CiresanMLP(widths=WIDTHS, recipe="sd_constant", in_features=16)
    set_drop_probs(model, (0.5,) * 4)
    for b in model.branches():
        b.generator = torch.Generator().manual_seed(1)
    states = [b.generator.get_state() for b in model.branches()]
    ctrl = GateController(model.branches(), DropSchedule("constant", (0.3,) * 4), seed=2)
    x = torch.randn(3, 16)
    for _ in range(10):
        ctrl.sample(0)
        model(x)
    assert all(torch.equal(s, b.generator.get_state()) for s, b in zip(states, model.branches()))
    ctrl.release()
    model(x)
    assert not any(
        torch.equal(s, b.generator.get_state()) for s, b in zip(states, model.branches())
    )


def test_state_dict_round_trip_resumes_the_decision_sequence():
    a = _own(0.4, seed=5)
    _decisions(a[1], 13)
    saved = copy.deepcopy(a.state_dict())
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    expected = _decisions(a[1], 50)
    b = _own(0.4, seed=99)
    b.load_state_dict(saved)
    assert _decisions(b[1], 50) == expected
    c = _own(0.4, seed=None)
    buffer.seek(0)
    c.load_state_dict(torch.load(buffer))
    assert _decisions(c[1], 50) == expected
    # extra state is a uint8 tensor under "<name>._extra_state"; weights and hashes leave it out
    assert saved["1._extra_state"].dtype == torch.uint8
    weights = cpu_state(a)
    assert "1._extra_state" not in weights
    named = {**dict(a.named_parameters()), **dict(a.named_buffers())}
    assert state_dict_digest(weights) == state_dict_digest(
        {k: v.detach() for k, v in named.items()}
    )
    fresh = _own(0.4, seed=None)
    load_cpu_state(fresh, weights)
    assert state_dict_digest(cpu_state(fresh)) == state_dict_digest(weights)
    with pytest.raises(FathomError, match="missing"):
        load_cpu_state(fresh, {k: v for k, v in weights.items() if k != "0.weight"})


def test_unseeded_module_seeds_from_torch_global_generator_at_first_draw():
    runs = []
    for _ in range(2):
        model = _own(0.5, seed=None)
        assert model[1].generator is None and model.state_dict()["1._extra_state"].numel() == 0
        torch.manual_seed(123)
        runs.append(_decisions(model[1], 40))
    assert runs[0] == runs[1] and set(runs[0]) == {True, False}
    other = [SkippableResidual(CountingBranch(5, 5), p=0.5) for _ in range(2)]
    torch.manual_seed(123)
    assert _decisions(other[0], 40) != _decisions(other[1], 40)  # distinct branches, own seeds


@pytest.mark.parametrize("bad", [1.0, -0.1, float("nan"), 1.5])
def test_drop_probability_outside_unit_interval_is_refused(bad):
    with pytest.raises(FathomError, match=r"outside \[0, 1\)"):
        SkippableResidual(nn.Linear(3, 3), p=bad)
    res = SkippableResidual(nn.Linear(3, 3), p=0.2)
    with pytest.raises(FathomError, match=r"outside \[0, 1\)"):
        res.p = bad
    assert res.p == 0.2
    model = _own(0.2)
    with pytest.raises(FathomError, match=r"outside \[0, 1\)"):
        set_drop_probs(model, [bad])
    with pytest.raises(FathomError, match="2 drop probabilities for 1 skippable branches"):
        set_drop_probs(model, [0.1, 0.2])
    assert model[1].p == 0.2


def test_cuda_graph_capture_of_a_self_sampling_module_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    res = SkippableResidual(nn.Linear(3, 3), p=0.2, seed=0)
    with pytest.raises(FathomError, match="cannot be captured in a CUDA graph"):
        res(torch.randn(2, 3))
    res.gain = 1.25  # gains set from outside (the trainer's graph path) draw nothing
    res(torch.randn(2, 3))


def test_torch_compile_graph_breaks_and_keeps_the_eager_decisions():
    """Compiled (aot_eager: dynamo + autograd tracing, no C++ toolchain) equals eager, from
    the first trace (the excluded draw's wrapper is made there, not at import) on."""
    torch._dynamo.reset()
    _OUTSIDE_COMPILE.clear()
    eager, compiled_model = _own(0.5, seed=3), _own(0.5, seed=3)
    compiled = torch.compile(compiled_model, backend="aot_eager")
    x = torch.randn(4, 6)
    for step in range(24):
        if step == 12:
            set_drop_probs(eager, [0.2])
            set_drop_probs(compiled_model, [0.2])
        assert torch.equal(compiled(x), eager(x)), step
    assert eager[1].branch.calls == compiled_model[1].branch.calls < 24
    eager.eval()
    compiled_model.eval()
    assert torch.equal(compiled(x), eager(x))
    assert set(_OUTSIDE_COMPILE) == {_uniform}
    for made in (True, False):  # fullgraph quotes the reason, with or without the wrapper made
        torch._dynamo.reset()
        if not made:
            _OUTSIDE_COMPILE.clear()
        whole = torch.compile(_own(0.5, seed=3), backend="aot_eager", fullgraph=True)
        with pytest.raises(Exception, match="draws its stochastic-depth decision on the host"):
            whole(x)
    torch._dynamo.reset()


OPTIMIZERS = {
    "sgd-momentum-wd": lambda ps, **k: torch.optim.SGD(
        ps, lr=0.05, momentum=0.9, weight_decay=1e-2, **k
    ),
    "adam-wd": lambda ps, **k: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-2, **k),
    "adamw": lambda ps, **k: torch.optim.AdamW(ps, lr=1e-2, weight_decay=1e-1, **k),
}


def _state_of(opt: torch.optim.Optimizer, params: list[nn.Parameter]) -> list[dict]:
    return [{k: v.clone() for k, v in opt.state[p].items()} for p in params]


def _same_state(a: list[dict], b: list[dict]) -> bool:
    return all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_plain_loop_skipped_branch_gets_no_update_of_any_optimizer_state(name, impl):
    """A dropped self-sampling branch: grad None, and its parameters, momentum, weight decay,
    Adam/AdamW moments and per-parameter ``step`` counts all stay bit-identical."""
    model = _own(0.5, seed=4)
    opt = OPTIMIZERS[name](model.parameters(), **impl)
    if name.startswith("sgd") and impl.get("fused"):
        # torch's fused SGD fails on a parameter whose first gradient comes after step one
        # (fathom.train.build.init_momentum_buffers documents it): give zero buffers up front
        init_momentum_buffers(opt)
    branch = model[1].branch
    own = list(branch.parameters())
    g = torch.Generator().manual_seed(0)
    seen = {"dropped_with_state": 0, "kept_with_state": 0}
    for _ in range(30):
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        weights = [p.detach().clone() for p in own]
        state = _state_of(opt, own)
        calls = branch.calls
        nn.functional.cross_entropy(model(x), y).backward()
        dropped = branch.calls == calls
        assert all((p.grad is None) == dropped for p in own)
        opt.step()
        opt.zero_grad(set_to_none=True)
        unchanged = all(torch.equal(p, w) for p, w in zip(own, weights, strict=True))
        if dropped:
            assert unchanged and _same_state(state, _state_of(opt, own))
            seen["dropped_with_state"] += bool(state[0])
        elif state[0]:
            assert not unchanged and not _same_state(state, _state_of(opt, own))
            seen["kept_with_state"] += 1
    assert seen["dropped_with_state"] >= 3 and seen["kept_with_state"] >= 3, seen
    if "step" in opt.state[own[0]]:  # Adam/AdamW count the steps a parameter was updated
        kept_steps = float(opt.state[own[0]]["step"])
        assert kept_steps < float(opt.state[model[0].weight]["step"]) == 30.0


def test_ciresan_eval_alone_is_dense_after_a_controller_drew_gates():
    """The reported bug: model.eval() kept the last training gains (a branch removed)."""
    torch.manual_seed(0)
    model = CiresanMLP(widths=WIDTHS, recipe="sd_constant", in_features=16)
    x = torch.randn(5, 16)
    with torch.no_grad(), dense_eval(model):
        dense = model(x)
    ctrl = GateController(model.branches(), DropSchedule("constant", (0.5,) * 4), seed=0)
    while all(ctrl.sample(0)):  # until some branch is dropped
        pass
    assert 0.0 in ctrl.gains()
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), dense)
        logits, taps = forward_taps(model, x)
        assert torch.equal(logits, dense) and all(z is not None for _, z in taps)
        with ctrl.masked((1, 0, 1, 1)):  # explicit masks do apply in eval()
            with branch_mask(model, (1, 0, 1, 1)):
                reference = model(x)
            assert torch.equal(model(x), reference) and not torch.equal(reference, dense)
        assert all(b.mask is None for b in model.branches())


def test_dense_eval_restores_every_module_flag_and_state_kept_every_buffer():
    """Once only the root's flag: a BatchNorm frozen in ``eval()`` inside a model in
    ``train()`` came back in ``train()``. ``state_kept`` undoes a forward's in-place buffer
    update and puts back a rebound buffer (the same tensor object)."""
    from fathom.depth import state_kept

    bn = nn.BatchNorm1d(3)
    model = nn.Sequential(nn.Linear(3, 3), SkippableResidual(bn), nn.Dropout(0.5)).train()
    bn.eval()
    flags = [m.training for m in model.modules()]
    assert flags.count(False) == 1
    with dense_eval(model):
        assert not any(m.training for m in model.modules())
    assert [m.training for m in model.modules()] == flags
    mean, count = bn.running_mean, bn.num_batches_tracked
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    with state_kept(model):
        bn.train()
        model(torch.randn(4, 3))  # updates the running statistics in place
        bn.running_mean = torch.ones(3)  # rebinds a buffer
        bn.register_buffer("extra", torch.zeros(1))
    bn.eval()
    emb = nn.Embedding(4, 3, max_norm=0.5)
    weight, table = emb.weight, emb.weight.detach().clone()
    with state_kept(emb):
        emb(torch.arange(4))  # renormalizes rows of the weight in place: not undone
    assert not torch.equal(emb.weight, table)
    emb.weight.data.copy_(table)
    with state_kept(emb, parameters=True):
        emb(torch.arange(4))
        emb.weight = nn.Parameter(torch.zeros(4, 3))
    assert emb.weight is weight and torch.equal(emb.weight, table)
    assert bn.running_mean is mean and bn.num_batches_tracked is count
    assert bn.state_dict().keys() == before.keys()
    assert all(torch.equal(v, bn.state_dict()[k]) for k, v in before.items())
