"""Gradient health: spectrum summaries by hand, the Jacobian against brute force, firing rates."""

from __future__ import annotations

import pytest
import torch

from fathom.base.io import state_dict_digest
from fathom.dynamics.health import (
    EPS64,
    firing_rates,
    input_output_jacobian,
    jacobian_health,
    spectrum_summary,
)
from fathom.models.convnet import StagedConvNet
from fathom.models.neurons import LIFConfig

torch.set_num_threads(1)


def test_spectrum_summary_drops_values_below_the_rank_floor():
    s = torch.tensor([1e-20, 3.0, 1.0], dtype=torch.float64)
    out = spectrum_summary(s, 3, 5)
    assert out.floor == pytest.approx(3.0 * 5 * EPS64)
    assert out.numerical_rank == 2 and out.full_rank == 3
    assert out.sigma_min == 1.0 and out.kappa == 3.0
    assert out.stable_rank == pytest.approx(10 / 9)


def test_spectrum_summary_of_zero_matrix_is_undefined_not_zero():
    out = spectrum_summary(torch.zeros(4, dtype=torch.float64), 4, 4)
    assert out.kappa is None and out.sigma_min is None and out.stable_rank is None
    assert out.numerical_rank == 0


@pytest.mark.parametrize(
    "kw", [dict(neuron="relu"), dict(neuron="lif", timesteps=2)], ids=["ann", "lif"]
)
def test_jacobian_matches_brute_force_and_leaves_model_alone(kw):
    torch.manual_seed(0)
    model = StagedConvNet(
        blocks_per_stage=1, classes=3, width_mult=1 / 16, in_channels=1, image_size=16, **kw
    )
    digest = state_dict_digest(model.state_dict())
    x = torch.randn(2, 1, 16, 16)
    jac = input_output_jacobian(model, x)
    assert jac.dtype == torch.float64 and jac.shape == (2, 3, 256)
    ref_model = model.double().eval()
    for b in range(2):
        ref = torch.autograd.functional.jacobian(lambda t: ref_model(t)[0], x[b : b + 1].double())
        torch.testing.assert_close(jac[b], ref.reshape(3, 256))
    model.float().train()
    assert state_dict_digest(model.state_dict()) == digest
    health = jacobian_health(model, x)
    assert health["jac/full_rank"] == 3 and health["jac/examples"] == 2
    assert health["jac/kappa"] >= 1.0


def test_firing_rates_and_silent_layers():
    torch.manual_seed(0)
    x = torch.rand(2, 1, 32, 32) * 4
    live = StagedConvNet(
        blocks_per_stage=1, classes=3, width_mult=1 / 16, in_channels=1, timesteps=2
    )
    rates = firing_rates(live, x)
    assert [r["layer"] for r in rates] == [f"blocks.{i}.neuron" for i in range(4)]
    first = live.blocks[0]
    with torch.no_grad():
        live.eval()
        manual = first.neuron(first.body(live.encode(x))).mean().item()
    assert rates[0]["rate"] == pytest.approx(manual)
    dead = StagedConvNet(
        blocks_per_stage=1,
        classes=3,
        width_mult=1 / 16,
        in_channels=1,
        timesteps=2,
        lif=LIFConfig(v_threshold=1e6),
    )
    assert all(r["silent"] and r["rate"] == 0.0 for r in firing_rates(dead, x))
    ann = StagedConvNet(
        blocks_per_stage=1, classes=3, width_mult=1 / 16, in_channels=1, neuron="relu"
    )
    assert firing_rates(ann, x) == []
