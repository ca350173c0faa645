"""Every per-example path of convolutions and eval-mode BatchNorm against a float64 loop.

The seam computes a convolution's per-example weight gradients by patches and one batched
matmul where an example's patch is small (a stem reading a few image channels), otherwise
by a grouped convolution one chunk of examples at a time; an eval-mode BatchNorm's by torch's
own fused BatchNorm backward over ``N*C`` channels, or elementwise where the layout does not
fit (a channels-last input). Each path is checked against the gradients of a plain loop over
examples (``loss_i.backward()`` one example at a time, float64), on generated geometries.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fathom.seam.pex_conv as pex_conv
from fathom.seam import discover
from fathom.seam.pex import per_example_grads


def _loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{name: [N, *shape]}``: each example's gradient of its own cross entropy, one
    ``backward`` per example."""
    rows = []
    for i in range(len(y)):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum").backward()
        rows.append({k: p.grad.clone() for k, p in model.named_parameters()})
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def _seam_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    seam = discover(model, x)
    with seam.capture() as calls:
        logits = model(x)
    cots = seam.cotangents(calls, F.cross_entropy(logits, y, reduction="sum"))
    out = {}
    for layer in seam.layers:
        got = per_example_grads(layer, calls[layer.name], cots[layer.name], len(y))
        out |= {q: got[p] for p, q in zip(layer.params, layer.qualified, strict=True)}
    return out


def _model(conv: nn.Module, x: torch.Tensor, channels_last: bool) -> nn.Module:
    norm = (
        nn.BatchNorm2d(conv.out_channels)
        if conv.weight.dim() == 4
        else nn.BatchNorm1d(conv.out_channels)
    )
    model = nn.Sequential(conv, norm, nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))
    model = model.to(torch.float64)
    model(x)  # (the lazy head takes its shape)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        norm.running_mean.copy_(torch.randn(norm.running_mean.shape, generator=g))
        norm.running_var.copy_(torch.rand(norm.running_var.shape, generator=g) + 0.5)
        norm.weight.copy_(torch.randn(norm.weight.shape, generator=g))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model.eval()


@settings(max_examples=30, deadline=None)
@given(
    c_in=st.integers(1, 6),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 2),
    dilation=st.integers(1, 2),
    padding=st.integers(0, 2),
    size=st.integers(5, 8),
    n=st.integers(1, 5),
    conv1d=st.booleans(),
    chunk=st.sampled_from([1, 2**30]),  # elements per grouped chunk: one example, or all
    columns=st.sampled_from([0, 1000]),  # the patch path never, or always
    channels_last=st.booleans(),
)
def test_conv_and_batchnorm_paths_match_a_loop(
    c_in, kernel, stride, dilation, padding, size, n, conv1d, chunk, columns, channels_last
) -> None:
    g = torch.Generator().manual_seed(c_in * 100 + size * 10 + n)
    shape = (n, c_in, size) if conv1d else (n, c_in, size, size + 1)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=g)
    torch.manual_seed(0)
    kind = nn.Conv1d if conv1d else nn.Conv2d
    conv = kind(c_in, 4, kernel, stride=stride, dilation=dilation, padding=padding)
    channels_last = channels_last and not conv1d
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    model = _model(conv, x, channels_last)
    want = _loop(model, x, y)
    old = pex_conv.GROUPED_ELEMENTS, pex_conv.PATCH_COLUMNS
    pex_conv.GROUPED_ELEMENTS, pex_conv.PATCH_COLUMNS = chunk, columns
    try:
        got = _seam_grads(model, x, y)
    finally:
        pex_conv.GROUPED_ELEMENTS, pex_conv.PATCH_COLUMNS = old
    assert set(got) == set(want)
    for name, w in want.items():
        err = float((got[name] - w).norm() / w.norm().clamp_min(1e-300))
        assert err <= 1e-12, (name, err)


@pytest.mark.parametrize("c_in", [2, 16])  # by patches / by the grouped convolution
def test_the_grouped_chunks_change_no_bit_and_patches_match_the_grouped_kernel(
    monkeypatch, c_in
) -> None:
    """Each example is its own group: one chunk per example gives the bits of one chunk for
    all; the patch product equals the grouped kernel's to float64 rounding."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, c_in, 9, 9, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (6,), generator=g)
    torch.manual_seed(1)
    model = _model(nn.Conv2d(c_in, 5, 3, padding=1), x, False)
    runs = {}
    for chunk, columns in [(2**30, 0), (1, 0), (2**30, 1000)]:
        monkeypatch.setattr(pex_conv, "GROUPED_ELEMENTS", chunk)
        monkeypatch.setattr(pex_conv, "PATCH_COLUMNS", columns)
        runs[(chunk, columns)] = _seam_grads(model, x, y)["0.weight"]
    assert torch.equal(runs[(2**30, 0)], runs[(1, 0)])
    patches, grouped = runs[(2**30, 1000)], runs[(2**30, 0)]
    assert float((patches - grouped).norm() / grouped.norm()) <= 1e-14
