"""Depth-wise Lyapunov exponents: exact on scaled orthogonal maps, equal to explicit Jacobians."""

from __future__ import annotations

import math

import pytest
import torch

from fathom.dynamics.lyapunov import eval_mode, lyapunov_exponents, model_lyapunov
from fathom.errors import FathomError
from fathom.models.convnet import StagedConvNet

torch.set_num_threads(1)
SCALES = [0.5, 2.0, 1.5, 0.8, 3.0]


def orthogonal(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q


def scaled_orthogonal_chain(d: int) -> list:
    mats = [s * orthogonal(d, i) for i, s in enumerate(SCALES)]
    return [lambda h, m=m: h @ m.T for m in mats]


@pytest.mark.parametrize("k", [1, 3, 8])
def test_scaled_orthogonal_network_recovers_mean_log_scale(k):
    x = torch.randn(4, 8, dtype=torch.float64)
    est = lyapunov_exponents(
        scaled_orthogonal_chain(8), x, k, generator=torch.Generator().manual_seed(0)
    )
    expected = sum(math.log(s) for s in SCALES) / len(SCALES)
    assert est.exponents.shape == (4, k)
    torch.testing.assert_close(est.exponents, torch.full((4, k), expected, dtype=torch.float64))
    per_block = torch.tensor([math.log(s) for s in SCALES], dtype=torch.float64)
    torch.testing.assert_close(est.log_gains, per_block.view(1, -1, 1).expand(4, -1, k))


def test_rms_normalization_ignores_a_change_of_dimension():
    # h -> s * [h, h]: the norm grows by s * sqrt(2), the RMS by s
    blocks = [lambda h: 2.0 * torch.cat([h, h], dim=1), lambda h: 0.5 * torch.cat([h, h, h], dim=1)]
    x = torch.randn(3, 5, dtype=torch.float64)
    for k in (1, 2):
        est = lyapunov_exponents(blocks, x, k, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(est.exponents, torch.zeros(3, k, dtype=torch.float64))


def test_full_spectrum_sums_to_mean_log_abs_det():
    d = 6
    g = torch.Generator().manual_seed(3)
    mats = [torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(4)]
    blocks = [lambda h, m=m: torch.tanh(h @ m.T) for m in mats]
    x = torch.randn(2, d, dtype=torch.float64, generator=g)
    est = lyapunov_exponents(blocks, x, d, generator=g)
    # brute force: log|det J_l| at the actual points h_l
    h, ref = x, torch.zeros(2, dtype=torch.float64)
    for block in blocks:
        jac = torch.stack(
            [torch.autograd.functional.jacobian(block, h[b : b + 1])[0, :, 0] for b in range(2)]
        )
        ref += torch.linalg.slogdet(jac).logabsdet / len(blocks)
        h = block(h)
    torch.testing.assert_close(est.exponents.sum(1), ref)


@pytest.mark.parametrize(
    "kw", [dict(neuron="relu"), dict(neuron="lif", timesteps=2)], ids=["ann", "lif"]
)
def test_conv_net_gains_match_explicit_float64_jacobians(kw):
    torch.manual_seed(0)
    model = StagedConvNet(
        blocks_per_stage=1, classes=3, width_mult=1 / 16, in_channels=1, image_size=16, **kw
    )
    model = model.double()
    model.train()  # model_lyapunov must switch BatchNorm to eval itself
    x = torch.randn(1, 1, 16, 16, dtype=torch.float64)
    v0 = torch.randn(1, 1, 1, 16, 16, dtype=torch.float64)
    est = model_lyapunov(model, x, tangents=v0)
    assert model.training
    with eval_mode(model):
        h, v, ref = x, v0[:, 0], []
        for block in model.lyapunov_blocks():
            jac = torch.autograd.functional.jacobian(block, h)  # [1, *out, 1, *in]
            out_shape = block(h).shape
            jv = jac.reshape(out_shape.numel(), h.numel()) @ v.reshape(-1)
            v_rms = v.square().mean().sqrt()
            out_rms = jv.square().mean().sqrt()
            ref.append(math.log(out_rms / v_rms))
            h, v = block(h), (jv / out_rms).reshape(out_shape)
    torch.testing.assert_close(est.log_gains[0, :, 0], torch.tensor(ref, dtype=torch.float64))


def test_gradient_reaches_conv_parameters_not_the_classifier():
    torch.manual_seed(0)
    model = StagedConvNet(
        blocks_per_stage=1, classes=3, width_mult=1 / 16, in_channels=1, timesteps=2
    )
    est = model_lyapunov(
        model, torch.randn(2, 1, 32, 32), generator=torch.Generator().manual_seed(0)
    )
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(est.maximal.mean(), list(params.values()), allow_unused=True)
    by_name = dict(zip(params, grads))
    assert by_name["classifier.weight"] is None and by_name["classifier.bias"] is None
    assert by_name["blocks.0.body.0.weight"].abs().sum() > 0


def test_running_statistics_untouched():
    model = StagedConvNet(
        blocks_per_stage=1, classes=3, width_mult=1 / 16, in_channels=1, neuron="relu"
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model_lyapunov(model, torch.randn(2, 1, 32, 32))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bad_input():
    x = torch.randn(2, 3, dtype=torch.float64)
    with pytest.raises(FathomError, match="at least one block"):
        lyapunov_exponents([], x)
    with pytest.raises(FathomError, match="fewer than k=3"):
        lyapunov_exponents([lambda h: h[:, :2]], x, 3)
    with pytest.raises(FathomError, match="does not depend on its input"):
        lyapunov_exponents([lambda h: torch.zeros_like(h)], x)
    with pytest.raises(FathomError, match="lyapunov_blocks"):
        model_lyapunov(torch.nn.Linear(3, 3), x)
