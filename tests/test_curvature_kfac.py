"""KFAC for Linear and Conv2d (KFC convention): factors against loops, exact cases, refusals."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

from fathom.curvature.exact import OutputDirections
from fathom.curvature.kfac import (
    exact_ggn_quadratic,
    kfac_diagonal,
    kfac_factors,
    kfac_quadratic,
    per_example_kfac_curvatures,
)
from fathom.curvature.probe import float64_copy, pull_back
from fathom.curvature.snapshot import curvature_snapshot
from fathom.pex import linear_rows
from fathom.seam import discover

torch.set_num_threads(1)
DT = torch.float64


def rows_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, name: str, kind: str = "ggn"):
    """``(a [N,T,d_in], u [K,N,T,d_out], delta [N,T,d_out])`` of layer ``name`` via the seam."""
    model = float64_copy(model)
    seam = discover(model, x)
    pb = pull_back(seam, x)
    layer = seam.layer(name)
    a, u = linear_rows(layer, pb.calls[name], pb.cotangents[name], x.shape[0], directions=True)
    dirs = OutputDirections.of(pb.logits, y)
    delta = torch.einsum("ic,cito->ito", dirs.residual, u)
    if kind == "ggn":
        u = torch.einsum("ick,cito->kito", dirs.sqrt_hessian, u)
    return a, u, delta


def exact_block(model: nn.Module, x: torch.Tensor, y: torch.Tensor, param: str, kind: str):
    """``(1/N) sum_i J_i^T M_i J_i`` restricted to one weight, by full per-example Jacobians."""
    model = float64_copy(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    rows = []
    for i in range(x.shape[0]):

        def logits(w: torch.Tensor, i: int = i) -> torch.Tensor:
            return functional_call(model, {**params, param: w}, (x[i : i + 1],))[0]

        j = jacrev(logits)(params[param]).reshape(-1, params[param].numel())  # [C, P]
        p = torch.softmax(logits(params[param]).detach(), -1)
        h = torch.diag_embed(p) - p[:, None] * p[None, :] if kind == "ggn" else torch.eye(len(p))
        rows.append(j.T @ h.to(DT) @ j)
    return torch.stack(rows).mean(0)


def conv_net(out_side_one: bool) -> nn.Module:
    k = 4 if out_side_one else 3
    return nn.Sequential(nn.Conv2d(2, 3, k), nn.Tanh(), nn.Flatten(), nn.LazyLinear(4))


def build(model: nn.Module, x: torch.Tensor) -> nn.Module:
    torch.manual_seed(0)
    model(x.float())
    return model.double().eval()


def test_conv_factors_match_the_kfc_definition_by_loops() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 5, 5, generator=g, dtype=DT)
    y = torch.tensor([0, 3, 1])
    model = build(conv_net(False), x)
    a, u, _ = rows_of(model, x, y, "0")
    f = kfac_factors(u, a)
    conv = model[0]
    n, positions = 3, 9
    want_a = torch.zeros(18, 18, dtype=DT)
    for i in range(n):
        for r in range(3):
            for c in range(3):
                patch = x[i, :, r : r + 3, c : c + 3].reshape(-1)
                want_a += torch.outer(patch, patch) / n
    torch.testing.assert_close(f.A.dense(), want_a, rtol=1e-12, atol=1e-14)
    # G: output-gradient second moment over positions (the same cotangents, looped)
    want_g = torch.zeros(3, 3, dtype=DT)
    for k in range(u.shape[0]):
        for i in range(n):
            for p in range(positions):
                want_g += torch.outer(u[k, i, p], u[k, i, p]) / (n * positions)
    torch.testing.assert_close(f.G.dense(), want_g, rtol=1e-12, atol=1e-14)
    assert conv.weight.reshape(3, -1).shape == (f.G.dense().shape[0], f.A.dense().shape[0])


@pytest.mark.parametrize("which", ["linear", "conv_one_position"])
def test_kfac_is_exact_on_one_example_at_one_position(which: str) -> None:
    g = torch.Generator().manual_seed(2)
    if which == "linear":
        model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double().eval()
        x, name = torch.randn(1, 5, generator=g, dtype=DT), "0"
    else:
        x, name = torch.randn(1, 2, 4, 4, generator=g, dtype=DT), "0"
        model = build(conv_net(True), x)
    y = torch.tensor([1])
    a, u, _ = rows_of(model, x, y, name)
    f = kfac_factors(u, a)
    exact = exact_block(model, x, y, f"{name}.weight", "ggn")
    torch.testing.assert_close(torch.kron(f.G.dense(), f.A.dense()), exact, rtol=1e-10, atol=1e-14)
    snap = curvature_snapshot(model, x, y).record
    layer = next(la for la in snap["layers"] if la["name"] == name)
    assert layer["kfac"]["kfac_diag_rel_l1_error"] == pytest.approx(0.0, abs=1e-12)
    assert layer["kfac"]["kfac_rayleigh_mean_gradient"] == pytest.approx(
        layer["kfac"]["exact_ggn_rayleigh_mean_gradient"], rel=1e-10
    )


def test_conv_kfac_is_not_exact_with_several_positions() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 5, 5, generator=g, dtype=DT)
    model = build(conv_net(False), x)
    y = torch.tensor([2])
    a, u, _ = rows_of(model, x, y, "0")
    f = kfac_factors(u, a)
    exact = exact_block(model, x, y, "0.weight", "ggn")
    err = float((torch.kron(f.G.dense(), f.A.dense()) - exact).abs().max() / exact.abs().max())
    assert err > 1e-3  # the spatial-decorrelation assumption is an approximation


@pytest.mark.parametrize("layer", ["0", "1", "2"])
def test_deep_linear_net_kfac_of_the_jacobian_gram_is_exact_for_many_examples(layer: str) -> None:
    """No nonlinearity: u_ic = W_{L..l+1}^T e_c is the same for every example, so the exact
    Jacobian-Gram block (1/N) sum_i sum_c (u_c u_c^T) (x) (a_i a_i^T) factorizes: G (x) A."""
    g = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 3), nn.Linear(3, 3)).double().eval()
    x = torch.randn(6, 4, generator=g, dtype=DT)
    y = torch.randint(0, 3, (6,), generator=g)
    a, u, _ = rows_of(model, x, y, layer, kind="jacobian_gram")
    f = kfac_factors(u, a)
    exact = exact_block(model, x, y, f"{layer}.weight", "jacobian_gram")
    torch.testing.assert_close(torch.kron(f.G.dense(), f.A.dense()), exact, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("conv", [False, True])
def test_diagonal_quadratics_and_per_example_curvatures_against_dense_kron(conv: bool) -> None:
    g = torch.Generator().manual_seed(5)
    if conv:
        x = torch.randn(4, 2, 5, 5, generator=g, dtype=DT)
        model = build(conv_net(False), x)
        name = "0"
    else:
        model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double().eval()
        x = torch.randn(4, 6, generator=g, dtype=DT)
        name = "2"
    y = torch.randint(0, 3, (4,), generator=g)
    a, u, delta = rows_of(model, x, y, name)
    f = kfac_factors(u, a)
    kron = torch.kron(f.G.dense(), f.A.dense())
    shape = (f.G.dense().shape[0], f.A.dense().shape[0])
    torch.testing.assert_close(kfac_diagonal(f), kron.diagonal().reshape(shape), rtol=1e-12, atol=0)
    v = torch.randn(shape, generator=g, dtype=DT)
    assert kfac_quadratic(v, f) == pytest.approx(
        float(v.reshape(-1) @ kron @ v.reshape(-1)), rel=1e-11
    )
    exact = exact_block(model, x, y, f"{name}.weight", "ggn")
    assert exact_ggn_quadratic(v, u, a) == pytest.approx(
        float(v.reshape(-1) @ exact @ v.reshape(-1)), rel=1e-10
    )
    got = per_example_kfac_curvatures(delta, a, f)
    for i in range(x.shape[0]):
        gi = torch.einsum("to,tj->oj", delta[i], a[i]).reshape(-1)
        assert got[i] == pytest.approx(float(gi @ kron @ gi / (gi @ gi)), rel=1e-10)


def test_snapshot_lists_layers_kfac_does_not_cover() -> None:
    model = nn.Sequential(nn.Linear(4, 5), nn.LayerNorm(5), nn.Linear(5, 3)).double().eval()
    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, 4, generator=g, dtype=DT)
    rec = curvature_snapshot(model, x, torch.randint(0, 3, (5,), generator=g)).record
    assert rec["kfac_not_covered"] == [{"layer": "1", "type": "LayerNorm"}]
    ln = rec["layers"][1]
    assert ln["kfac"]["covered"] is False and "LayerNorm" in ln["kfac"]["reason"]
    assert ln["ggn_weight_trace"] > 0  # exact diagonals still cover it
    assert len(rec["layers"][0]["kfac"]["kfac_rayleigh_per_example"]) == 5
