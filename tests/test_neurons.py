"""LIF dynamics and the arctan surrogate against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from fathom.errors import FathomError
from fathom.models.neurons import LIF, LIFConfig, lif_multistep, spike

torch.set_num_threads(1)


def test_spike_forward_is_exact_step():
    u = torch.tensor([-1.0, -1e-7, 0.0, 1e-7, 3.0], requires_grad=True)
    s = spike(u)
    assert s.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("u", "alpha", "expected"),
    [
        (0.0, 2.0, 1.0),  # g'(0) = alpha / 2
        (1 / math.pi, 2.0, 0.5),  # (pi * 2 * u / 2)^2 = 1
        (0.0, 4.0, 2.0),
        (1 / (2 * math.pi), 4.0, 1.0),  # (pi * 4 * u / 2)^2 = 1 -> 2 / 2
    ],
)
def test_surrogate_backward_and_jvp_hand_values(u, alpha, expected):
    x = torch.tensor([u], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(spike(x, alpha).sum(), x)
    assert g.item() == pytest.approx(expected, rel=1e-12)
    closed_form = (alpha / 2) / (1 + (math.pi * alpha * u / 2) ** 2)  # g'(u)
    assert closed_form == pytest.approx(expected, rel=1e-12)
    _, tangent = torch.func.jvp(lambda t: spike(t, alpha), (x.detach(),), (torch.ones_like(x),))
    assert tangent.item() == pytest.approx(expected, rel=1e-12)


def _run(x, **kw):
    return lif_multistep(torch.tensor(x, dtype=torch.float64).view(1, -1), **kw).view(-1).tolist()


def test_lif_forward_hand_computed_hard_reset():
    # tau=2: h1 = 1.5/2 = .75 (no spike); h2 = .75 + (1.5-.75)/2 = 1.125 (spike, v=0);
    # h3 = .4/2 = .2; h4 = .2 + 2.8/2 = 1.6 (spike)
    assert _run([1.5, 1.5, 0.4, 3.0]) == [0.0, 1.0, 0.0, 1.0]


def test_lif_soft_and_hard_reset_differ_where_computed():
    # h1 = 1.25 spikes; hard: v1 = 0, h2 = 1.75/2 = .875 (silent);
    # soft: v1 = .25, h2 = .25 + (1.75 - .25)/2 = 1.0 (spikes, Θ(0) = 1)
    assert _run([2.5, 1.75], reset="hard") == [1.0, 0.0]
    assert _run([2.5, 1.75], reset="soft") == [1.0, 1.0]


@pytest.mark.parametrize(
    ("reset", "detach", "expected"),
    [
        # x1 = 2 -> h1 = 1, u1 = 0, s1 = 1, g'(u1) = 1; x2 = 2 -> u2 = 0 in every case below.
        # ds2/dx1 = g'(u2) * dh2/dv1 * dv1/dx1, dh2/dv1 = 1 - 1/tau = 1/2.
        ("hard", False, -0.25),  # dv1/dx1 = (1 - s1)/2 - h1 g'(u1)/2 = -1/2
        ("hard", True, 0.0),  # dv1/dx1 = (1 - s1)/2 = 0
        ("soft", False, 0.0),  # dv1/dx1 = 1/2 - g'(u1)/2 = 0
        ("soft", True, 0.25),  # dv1/dx1 = 1/2
    ],
)
def test_surrogate_backward_through_reset(reset, detach, expected):
    # hard: v1 = 0; soft: v1 = h1 - 1 = 0; either way h2 = 2/2 = 1
    x = torch.tensor([[2.0, 2.0]], dtype=torch.float64, requires_grad=True)
    s = lif_multistep(x, reset=reset, detach_reset=detach)
    assert s.detach().view(-1).tolist() == [1.0, 1.0]
    (g,) = torch.autograd.grad(s[0, 1], x)
    assert g[0, 0].item() == pytest.approx(expected, abs=1e-12)
    assert g[0, 1].item() == pytest.approx(0.5, rel=1e-12)  # g'(0) * dh2/dx2 = 1 * 1/2


def test_lif_module_state_resets_between_calls_and_samples():
    torch.manual_seed(0)
    lif = LIF(timesteps=3)
    x = torch.rand(2 * 3, 5) * 3
    first = lif(x)
    assert torch.equal(lif(x), first)  # no membrane carried over between batches
    alone = lif(x[3:])  # sample 1 alone (batch-major fold: rows 3..5)
    assert torch.equal(alone, first[3:])


def test_lif_bad_config():
    with pytest.raises(FathomError, match="reset"):
        LIFConfig(reset="zero")
    with pytest.raises(FathomError, match="timesteps"):
        LIF(0)
