"""The kept branch gained and summed in place: bit-identical to the reference form, and
refused wherever someone else may hold the branch's output (hooks, non-Linear branches)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

import fathom.depth.residual as residual
from conftest import synthetic_splits, tiny_config
from fathom.base.io import state_dict_digest
from fathom.depth import Crop, SkippableResidual, skippable_residual
from fathom.rundir import RunDir
from fathom.train.build import build_controller, build_optimizer, init_model
from fathom.train.loop import train
from fathom.train.plan import plan_epoch
from fathom.train.steppers import EagerStepper

torch.set_num_threads(1)


def reference(x, branch, bypass, gain):
    """The autograd form the in-place path must reproduce bit for bit."""
    return bypass(x) + branch(x) * gain


def _grads(fn, x, lin, gain, gy):
    x = x.detach().clone().requires_grad_()
    y = fn(x, lin, Crop(lin.out_features), gain)
    grads = torch.autograd.grad(y, (x, lin.weight, lin.bias), gy)
    return y.detach(), grads


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 9),
    d_out=st.integers(1, 12),
    extra=st.integers(0, 6),
    gain=st.floats(-3.0, 20.0).filter(lambda g: g not in (0.0, 1.0)),  # 0 skips, 1 adds
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
@example(batch=64, d_out=200, extra=50, gain=1 / 0.7, dtype=torch.float32, seed=0)
@example(batch=1, d_out=1, extra=0, gain=-0.5, dtype=torch.float32, seed=1)
@example(batch=3, d_out=4, extra=2, gain=1e-30, dtype=torch.float64, seed=2)
def test_in_place_form_is_bit_identical_forward_and_backward(
    batch, d_out, extra, gain, dtype, seed
):
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(d_out + extra, d_out).to(dtype)
    x = torch.randn(batch, d_out + extra, generator=g, dtype=dtype)
    gy = torch.randn(batch, d_out, generator=g, dtype=dtype)
    y_ref, g_ref = _grads(reference, x, lin, gain, gy)
    y_new, g_new = _grads(skippable_residual, x, lin, gain, gy)
    assert torch.equal(y_new, y_ref)
    for a, b in zip(g_new, g_ref, strict=True):
        assert torch.equal(a, b)


def test_in_place_path_is_taken_and_gradchecks_in_float64(monkeypatch):
    taken = []
    original = residual.owns_output
    monkeypatch.setattr(
        residual, "owns_output", lambda b, o: taken.append(original(b, o)) or taken[-1]
    )
    lin = nn.Linear(5, 3).double()
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    w = lin.weight.detach().clone().requires_grad_()
    b = lin.bias.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, w, b: skippable_residual(x, _Fixed(w, b), Crop(3), 1.25), (x, w, b)
    )
    assert taken and all(taken), "a plain Linear branch takes the in-place path"
    assert torch.autograd.gradgradcheck(
        lambda x, w, b: skippable_residual(x, _Fixed(w, b), Crop(3), 1.25), (x, w, b)
    )


class _Fixed(nn.Linear):
    """A plain ``nn.Linear`` (same class forward) holding given tensors as its weight, bias."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        self.weight, self.bias = w, b


def test_hooked_branch_keeps_the_captured_output_unchanged():
    lin = nn.Linear(6, 4)
    seen = []
    handle = lin.register_forward_hook(lambda m, i, out: seen.append((out, out.clone())))
    x = torch.randn(3, 6, requires_grad=True)
    y = skippable_residual(x, lin, Crop(4), 2.5)
    captured, copy = seen[0]
    assert torch.equal(captured, copy), "the hook's tensor was modified after it captured it"
    assert captured.data_ptr() != y.data_ptr()
    handle.remove()
    assert torch.equal(y, reference(x, lin, Crop(4), 2.5))
    assert residual.owns_output(lin, lin(x))


@pytest.mark.parametrize("kind", ["forward", "forward_pre", "backward", "global"])
def test_every_kind_of_hook_refuses_the_in_place_path(kind):
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    hooks = {
        "forward": lambda: lin.register_forward_hook(lambda m, i, o: None),
        "forward_pre": lambda: lin.register_forward_pre_hook(lambda m, i: None),
        "backward": lambda: lin.register_full_backward_hook(lambda m, gi, go: None),
        "global": lambda: nn.modules.module.register_module_forward_hook(lambda m, i, o: None),
    }
    handle = hooks[kind]()
    try:
        assert not residual.owns_output(lin, torch.nn.functional.linear(x, lin.weight))
        y = skippable_residual(x, lin, Crop(4), 1.5)
        assert torch.equal(y, reference(x, lin, Crop(4), 1.5))
    finally:
        handle.remove()
    assert residual.owns_output(lin, torch.nn.functional.linear(x, lin.weight))


def test_branches_that_may_alias_their_output_take_the_reference_path():
    x = torch.randn(3, 4)
    before = x.clone()
    y = skippable_residual(x, nn.Identity(), nn.Identity(), 2.0)  # out is x itself
    assert torch.equal(x, before) and torch.equal(y, before + before * 2.0)
    relu_last = nn.Sequential(nn.Linear(4, 4), nn.ReLU())  # ReLU saves its output
    xg = x.clone().requires_grad_()
    skippable_residual(xg, relu_last, nn.Identity(), 2.0).sum().backward()
    assert not residual.owns_output(relu_last, relu_last(x))

    class Sub(nn.Linear):
        def forward(self, h):
            return self.weight[:1].expand(h.shape[0], -1)  # a view of a parameter

    sub = Sub(4, 4)
    w0 = sub.weight.detach().clone()
    skippable_residual(x, sub, nn.Identity(), 3.0)
    assert torch.equal(sub.weight, w0) and not residual.owns_output(sub, sub(x))


def test_a_bypass_of_another_dtype_or_shape_is_summed_out_of_place():
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    wide = skippable_residual(x, lin, lambda h: h.sum(0), 1.5)  # broadcasting bypass
    assert torch.equal(wide, reference(x, lin, lambda h: h.sum(0), 1.5))
    f64 = skippable_residual(x, lin, lambda h: h.double(), 1.5)  # promotes to float64
    assert f64.dtype == torch.float64
    assert torch.equal(f64, reference(x, lin, lambda h: h.double(), 1.5))


def _force(monkeypatch, in_place: bool) -> list[bool]:
    """Record every ``owns_output`` answer; force the reference path unless ``in_place``."""
    answers: list[bool] = []
    original = residual.owns_output

    def spy(branch, out):
        answers.append(original(branch, out) and in_place)
        return answers[-1]

    monkeypatch.setattr(residual, "owns_output", spy)
    return answers


def _digest(cfg, monkeypatch, in_place: bool) -> tuple[str, list[float]]:
    """Final state-dict digest and epoch losses of a tiny eager run (3 epochs)."""
    answers = _force(monkeypatch, in_place)
    splits = synthetic_splits(n_fit=160, n_eval=8)
    model = init_model(cfg)
    controller = build_controller(model, cfg)
    opt = build_optimizer(model, cfg.optim)
    stepper = EagerStepper(model, opt, controller, splits, torch.device("cpu"), "fp32")
    gen = torch.Generator().manual_seed(5)
    losses = []
    for epoch in (1, 2, 3):
        plan = plan_epoch(epoch, 160, cfg.optim.batch_size, gen, controller, cfg.optim)
        losses.append(stepper.run_epoch(plan).item())
    monkeypatch.undo()
    assert any(answers) == (in_place and cfg.model.recipe != "residual"), "path not exercised"
    return state_dict_digest(model.state_dict()), losses


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
@pytest.mark.parametrize("recipe", ["sd_constant", "sd_decreasing", "residual"])
def test_anchor_final_weights_unchanged_by_the_in_place_path(monkeypatch, optim, recipe):
    cfg = tiny_config(**{"model.recipe": recipe, "optim.name": optim, "optim.lr": 0.01})
    assert _digest(cfg, monkeypatch, True) == _digest(cfg, monkeypatch, False)


def test_telemetry_on_run_is_identical_with_and_without_the_in_place_path(tmp_path, monkeypatch):
    """The seam's hooks see what they saw before: every non-clock history field is equal."""
    cfg = tiny_config(**{"model.recipe": "sd_constant", "optim.epochs": 2})
    runs = {}
    for in_place in (True, False):
        _force(monkeypatch, in_place)
        res = train(cfg, tmp_path / str(in_place), splits=synthetic_splits(), telemetry=True)
        monkeypatch.undo()
        rows = RunDir(res.run_dir).history()
        runs[in_place] = (res.final_params, [_science(r) for r in rows])
    assert runs[True] == runs[False]
    assert any(k.startswith(("grad/", "probe/")) for k in runs[True][1][-1])


def _science(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("clock/")}


def test_skipped_branch_semantics_hold_on_the_in_place_path():
    torch.manual_seed(0)
    model = nn.Sequential(
        SkippableResidual(nn.Linear(4, 4)), SkippableResidual(nn.Linear(4, 4), Crop(4))
    )
    model[0].gain, model[1].gain = 0.0, 1.5
    loss = model(torch.randn(3, 4)).square().sum()
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    assert grads[0] is None and grads[1] is None, "a skipped branch gets no gradient"
    assert all(g is not None and g.abs().sum() > 0 for g in grads[2:])
