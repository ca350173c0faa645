"""A kept branch's gain, ``bypass(x) + branch(x) * g`` with ``g`` a cached 0-d tensor
(:func:`fathom.depth.residual.gain_tensor`): bit-identical to the Python-float form forward and
backward, and never writing into a tensor someone else holds (hooks, aliasing branches).

The in-place form these tests once guarded (``out.mul_(g).add_(bypass(x))``) was removed as
slower per step (docs/benchmarks-history.md#sd-quiet-rerun-089c6f1); the hook and aliasing tests
stay so that no later fast path may modify a captured output, an input or a parameter unseen."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from fathom.depth import Crop, SkippableResidual, skippable_residual

torch.set_num_threads(1)


def reference(x, branch, bypass, gain):
    """The autograd form with the Python-float gain."""
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
def test_the_gain_form_is_bit_identical_forward_and_backward(
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


def test_the_gain_form_gradchecks_in_float64():
    lin = nn.Linear(5, 3).double()
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    w = lin.weight.detach().clone().requires_grad_()
    b = lin.bias.detach().clone().requires_grad_()
    f = lambda x, w, b: skippable_residual(x, _Fixed(w, b), Crop(3), 1.25)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradgradcheck(f, (x, w, b))


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


@pytest.mark.parametrize("kind", ["forward", "forward_pre", "backward", "global"])
def test_every_kind_of_hook_sees_the_reference_values(kind):
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
        y = skippable_residual(x, lin, Crop(4), 1.5)
        assert torch.equal(y, reference(x, lin, Crop(4), 1.5))
    finally:
        handle.remove()


def test_branches_that_alias_their_output_leave_inputs_and_parameters_untouched():
    x = torch.randn(3, 4)
    before = x.clone()
    y = skippable_residual(x, nn.Identity(), nn.Identity(), 2.0)  # out is x itself
    assert torch.equal(x, before) and torch.equal(y, before + before * 2.0)
    relu_last = nn.Sequential(nn.Linear(4, 4), nn.ReLU())  # ReLU saves its output
    xg = x.clone().requires_grad_()
    skippable_residual(xg, relu_last, nn.Identity(), 2.0).sum().backward()

    class Sub(nn.Linear):
        def forward(self, h):
            return self.weight[:1].expand(h.shape[0], -1)  # a view of a parameter

    sub = Sub(4, 4)
    w0 = sub.weight.detach().clone()
    skippable_residual(x, sub, nn.Identity(), 3.0)
    assert torch.equal(sub.weight, w0)


def test_a_bypass_of_another_dtype_or_shape_is_summed_out_of_place():
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    wide = skippable_residual(x, lin, lambda h: h.sum(0), 1.5)  # broadcasting bypass
    assert torch.equal(wide, reference(x, lin, lambda h: h.sum(0), 1.5))
    f64 = skippable_residual(x, lin, lambda h: h.double(), 1.5)  # promotes to float64
    assert f64.dtype == torch.float64
    assert torch.equal(f64, reference(x, lin, lambda h: h.double(), 1.5))


def test_skipped_branch_semantics():
    torch.manual_seed(0)
    model = nn.Sequential(
        SkippableResidual(nn.Linear(4, 4)), SkippableResidual(nn.Linear(4, 4), Crop(4))
    )
    model[0].gain, model[1].gain = 0.0, 1.5
    loss = model(torch.randn(3, 4)).square().sum()
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    assert grads[0] is None and grads[1] is None, "a skipped branch gets no gradient"
    assert all(g is not None and g.abs().sum() > 0 for g in grads[2:])
