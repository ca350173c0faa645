"""What a kept branch's gain dispatches beyond the dense step, and that removing it kept the bits.

A kept branch's gain multiplies by a cached 0-d tensor of the output's dtype
(:func:`fathom.depth.residual.gain_tensor`) instead of a Python float (which is wrapped as a
float64 scalar and converted in the forward multiply and again in its backward); the
controller writes the per-step gains past ``nn.Module.__setattr__``
(:func:`fathom.depth.residual.set_gain`).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.profiler import ProfilerActivity, profile

import fathom.depth.control as control
import fathom.depth.residual as residual
from conftest import synthetic_splits, tiny_config
from fathom.base.io import state_dict_digest
from fathom.depth import Crop, DropSchedule, GateController, SkippableResidual, skippable_residual
from fathom.depth.residual import gain_tensor, set_gain
from fathom.train.build import build_controller, build_optimizer, init_model
from fathom.train.plan import plan_epoch
from fathom.train.steppers import EagerStepper

torch.set_num_threads(1)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _mul_and_grad(out: torch.Tensor, gain, gy: torch.Tensor, in_place: bool):
    leaf = out.detach().clone().requires_grad_()
    src = leaf * 1.0 if in_place else leaf  # in place on a non-leaf, as the branch output is
    y = src.mul_(gain) if in_place else src * gain
    (grad,) = torch.autograd.grad(y, leaf, gy)
    return y.detach(), grad


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 9),
    cols=st.integers(1, 40),
    gain=st.floats(allow_nan=False, allow_infinity=False, width=64).filter(lambda g: g != 0.0),
    dtype=st.sampled_from(DTYPES),
    in_place=st.booleans(),
    seed=st.integers(0, 2**16),
)
@example(rows=64, cols=200, gain=1 / 0.7, dtype=torch.float32, in_place=True, seed=0)
@example(rows=3, cols=33, gain=1e-40, dtype=torch.float32, in_place=True, seed=1)  # subnormal
@example(rows=2, cols=17, gain=3.3e38, dtype=torch.float32, in_place=False, seed=2)  # overflow
@example(rows=2, cols=5, gain=1 / 0.9, dtype=torch.bfloat16, in_place=True, seed=3)
@example(rows=1, cols=1, gain=-2.5e-300, dtype=torch.float64, in_place=True, seed=4)
def test_gain_tensor_product_is_bit_identical_to_the_python_float(
    rows, cols, gain, dtype, in_place, seed
):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(rows, cols, generator=g, dtype=torch.float64).to(dtype)
    gy = torch.randn(rows, cols, generator=g, dtype=torch.float64).to(dtype)
    y_ref, g_ref = _mul_and_grad(out, gain, gy, in_place)
    y_new, g_new = _mul_and_grad(out, gain_tensor(gain, out), gy, in_place)
    assert y_new.dtype == y_ref.dtype == dtype
    assert torch.equal(y_new.view(torch.uint8), y_ref.view(torch.uint8))  # NaN/inf, -0 too
    assert torch.equal(g_new.view(torch.uint8), g_ref.view(torch.uint8))


def test_gain_tensor_is_cached_per_value_and_dtype_and_bounded():
    x32, x64 = torch.ones(2), torch.ones(2, dtype=torch.float64)
    a, b = gain_tensor(1.25, x32), gain_tensor(1.25, x32)
    assert a is b and a.dtype == torch.float32 and a.dim() == 0 and not a.requires_grad
    c = gain_tensor(1.25, x64)
    assert c is not a and c.dtype == torch.float64 and c.item() == 1.25
    for i in range(residual._GAIN_CACHE_SIZE + 40):
        gain_tensor(1.0 + i / 1024, x32)
    assert len(residual._GAIN_TENSORS) <= residual._GAIN_CACHE_SIZE
    for dtype in (torch.bfloat16, torch.float16):  # the kernel's scalar is float32 there
        assert gain_tensor(1.25, torch.ones(2, dtype=dtype)) == 1.25
    assert type(gain_tensor(1.25, torch.ones(2, device="meta"))) is float


def test_a_gain_first_cached_in_inference_mode_still_trains():
    residual._GAIN_TENSORS.clear()
    lin = nn.Linear(3, 3)
    with torch.inference_mode():  # an evaluation that happens to meet the gain first
        y_inf = skippable_residual(torch.randn(2, 3), lin, nn.Identity(), 1.75)
    assert y_inf.is_inference() and not gain_tensor(1.75, y_inf).is_inference()
    x = torch.randn(2, 3, requires_grad=True)
    skippable_residual(x, lin, nn.Identity(), 1.75).sum().backward()  # saves the gain tensor
    assert torch.allclose(x.grad, (lin.weight.detach().sum(0) * 1.75 + 1).expand(2, 3))


def _dispatched(fn) -> dict[str, int]:
    """Every operator call (dispatcher level, conversions inside kernels included)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key: e.count for e in prof.key_averages()}


def test_a_kept_branch_dispatches_two_multiplies_and_no_conversion():
    torch.manual_seed(0)
    h = torch.randn(8, 6, requires_grad=True)
    lin, crop, gy = nn.Linear(6, 4), Crop(4), torch.randn(8, 4)

    def step(gain):
        return lambda: torch.autograd.grad(skippable_residual(h, lin, crop, gain), h, gy)

    step(1.5)()  # warm
    dense, kept = _dispatched(step(1.0)), _dispatched(step(1.5))
    saved = residual.gain_tensor
    residual.gain_tensor = lambda gain, out: gain  # the Python-float form
    try:
        reference = _dispatched(step(1.5))
    finally:
        residual.gain_tensor = saved
    for ops in (dense, kept):
        assert ops.get("aten::to", 0) == ops.get("aten::_to_copy", 0) == 0, ops
    assert reference["aten::to"] == 2, "the Python float converts in forward and backward"
    assert kept["aten::mul"] == 2 and "aten::mul_" not in kept  # forward gain, MulBackward0
    assert "aten::mul" not in dense and "aten::mul_" not in dense


def test_set_gain_stores_what_setattr_stores():
    fast, slow = SkippableResidual(nn.Linear(3, 3)), SkippableResidual(nn.Linear(3, 3))
    for g in (1.5, None, 0.0, math.inf):
        set_gain(fast, g)
        slow.gain = g
        assert fast.gain == slow.gain and type(fast.gain) is type(slow.gain)
        assert fast.__dict__.keys() == slow.__dict__.keys()
        assert fast._buffers.keys() == slow._buffers.keys() == set()
    t = torch.tensor(2.0)
    set_gain(fast, t)  # a tensor gain (the graph path) goes through setattr
    assert fast.gain is t and "gain" not in fast._buffers


def test_set_gain_of_a_subclass_goes_through_its_own_attribute():
    seen: list[float | None] = []

    class Logged(SkippableResidual):
        @property
        def gain(self):
            return self.__dict__.get("_g")

        @gain.setter
        def gain(self, value):
            seen.append(value)
            self.__dict__["_g"] = value

    m = Logged(nn.Linear(2, 2))
    set_gain(m, 1.25)
    assert m.gain == 1.25 and seen == [None, 1.25]


def test_controller_gains_drive_the_forward_as_before():
    torch.manual_seed(1)
    model = nn.Sequential(*(SkippableResidual(nn.Linear(5, 5)) for _ in range(3)))
    ctl = GateController(list(model), DropSchedule("constant", (0.2, 0.3, 0.4)), seed=3)
    x = torch.randn(4, 5)
    for epoch in range(6):
        kept = ctl.sample(epoch)
        h = x
        for m, k, p in zip(model, kept, (0.2, 0.3, 0.4), strict=True):
            assert m.gain == (1 / (1 - p) if k else 0.0)
            h = h + m.branch(h) * m.gain if k else h
        assert torch.equal(model(x), h)
    ctl.release()
    assert all(m.gain is None for m in model)


def _tiny_run(cfg) -> tuple[str, list[float]]:
    """Final state-dict digest and epoch losses of a tiny eager run (3 epochs, 5 steps each)."""
    splits = synthetic_splits(n_fit=160, n_eval=8)
    model = init_model(cfg)
    controller = build_controller(model, cfg)
    stepper = EagerStepper(
        model, build_optimizer(model, cfg.optim), controller, splits, torch.device("cpu")
    )
    gen = torch.Generator().manual_seed(5)
    losses = []
    for epoch in (1, 2, 3):
        plan = plan_epoch(epoch, 160, cfg.optim.batch_size, gen, controller, cfg.optim)
        losses.append(stepper.run_epoch(plan).item())
    return state_dict_digest(model.state_dict()), losses


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
@pytest.mark.parametrize("recipe", ["sd_constant", "sd_decreasing", "residual"])
def test_anchor_final_weights_unchanged_by_the_gain_tensor_and_set_gain(monkeypatch, optim, recipe):
    """Before (Python-float gain, ``Module.__setattr__``) and after: the same final digest."""
    cfg = tiny_config(**{"model.recipe": recipe, "optim.name": optim, "optim.lr": 0.01})
    used = []
    original = residual.gain_tensor
    monkeypatch.setattr(residual, "gain_tensor", lambda g, out: used.append(1) or original(g, out))
    after = _tiny_run(cfg)
    assert bool(used) == (recipe != "residual"), "the gain tensor path was not exercised"
    monkeypatch.setattr(residual, "gain_tensor", lambda g, out: g)
    monkeypatch.setattr(control, "set_gain", lambda b, g: setattr(b, "gain", g))
    assert _tiny_run(cfg) == after
