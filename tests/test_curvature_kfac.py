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
    kfac_reduce_factors,
    kronecker_factors,
    per_example_kfac_curvatures,
)
from fathom.curvature.probe import float64_copy, pull_back
from fathom.curvature.snapshot import curvature_snapshot
from fathom.errors import FathomError
from fathom.seam import discover
from fathom.seam.pex import linear_rows

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


# -- KFAC-reduce and the public function --------------------------------------------------------
class MeanPooledTokens(nn.Module):
    """``[N, T, d_in] -> Linear over the tokens -> mean over T -> tanh -> Linear``: the
    weight-sharing (token) dimension of layer ``lin`` is mean-pooled straight after it."""

    def __init__(self, d_in: int = 3, hidden: int = 4, classes: int = 3, act: bool = True) -> None:
        super().__init__()
        self.lin, self.head, self.act = nn.Linear(d_in, hidden), nn.Linear(hidden, classes), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x).mean(1)
        return self.head(torch.tanh(h) if self.act else h)


def pooled_conv() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 3, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Tanh(), nn.Linear(3, 4)
    )


def kron(f) -> torch.Tensor:
    return torch.kron(f.G.dense(), f.A.dense())


@pytest.mark.parametrize("which", ["tokens", "conv"])
def test_reduce_is_exact_on_one_example_pooled_straight_after_the_layer(which: str) -> None:
    """One datum, ``P > 1`` positions mean-pooled after the layer: ``u_ikp = u_ik / P``, so the
    exact GGN block is ``(sum_k gbar_k gbar_k^T) (x) (abar abar^T)``: reduce is exact, expand
    (which sums ``a a^T`` over positions) is not."""
    g = torch.Generator().manual_seed(11)
    if which == "tokens":
        torch.manual_seed(11)
        model, name = MeanPooledTokens().double().eval(), "lin"
        x = torch.randn(1, 5, 3, generator=g, dtype=DT)
    else:
        x, name = torch.randn(1, 2, 5, 5, generator=g, dtype=DT), "0"
        model = build(pooled_conv(), x)
    y = torch.tensor([1])
    exact = exact_block(model, x, y, f"{name}.weight", "ggn")
    got = kronecker_factors(model, x, y, kind="reduce").layers[name]
    assert got.positions > 1 and got.chosen == "reduce"
    torch.testing.assert_close(kron(got.factors["reduce"]), exact, rtol=1e-10, atol=1e-14)
    expand = kron(kronecker_factors(model, x, y, kind="expand").layers[name].factors["expand"])
    assert float((expand - exact).abs().max() / exact.abs().max()) > 1e-2


def test_reduce_is_exact_for_many_examples_when_directions_do_not_depend_on_the_example() -> None:
    """Linear tokens, mean pool, linear head, Jacobian Gram: ``gbar_ik = W_head^T e_k`` for every
    example, so ``(1/N) sum_i G (x) abar_i abar_i^T = G (x) A`` exactly, with ``N = 5``."""
    g = torch.Generator().manual_seed(12)
    torch.manual_seed(12)
    model = MeanPooledTokens(act=False).double().eval()
    x = torch.randn(5, 4, 3, generator=g, dtype=DT)
    y = torch.randint(0, 3, (5,), generator=g)
    a, u, _ = rows_of(model, x, y, "lin", kind="jacobian_gram")
    f = kfac_reduce_factors(u, a)
    exact = exact_block(model, x, y, "lin.weight", "jacobian_gram")
    torch.testing.assert_close(kron(f), exact, rtol=1e-10, atol=1e-13)


def test_expand_is_exact_on_one_example_at_one_position_and_equals_reduce_there() -> None:
    g = torch.Generator().manual_seed(13)
    torch.manual_seed(13)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double().eval()
    x, y = torch.randn(1, 5, generator=g, dtype=DT), torch.tensor([2])
    both = {
        k: kronecker_factors(model, x, y, kind=k).layers["0"].factors[k]
        for k in ("expand", "reduce")
    }
    exact = exact_block(model, x, y, "0.weight", "ggn")
    for f in both.values():
        assert f.positions == 1
        torch.testing.assert_close(kron(f), exact, rtol=1e-10, atol=1e-14)


def test_reduce_factors_match_their_definition_by_loops() -> None:
    """``A = (1/N) sum_i abar_i abar_i^T``, ``G = (1/N) sum_i sum_k gbar_ik gbar_ik^T`` with
    ``abar`` the patch mean and ``gbar`` the output-gradient sum over positions, by loops over
    patches (``x`` sliced) and over the GGN square-root columns."""
    g = torch.Generator().manual_seed(14)
    x = torch.randn(3, 2, 5, 5, generator=g, dtype=DT)
    y = torch.tensor([0, 3, 1])
    model = build(conv_net(False), x)
    got = kronecker_factors(model, x, y, kind="reduce").layers["0"].factors["reduce"]
    _, u, _ = rows_of(model, x, y, "0")  # [K, N, P, d_out]
    want_a = torch.zeros(18, 18, dtype=DT)
    want_g = torch.zeros(3, 3, dtype=DT)
    for i in range(3):
        mean = (
            sum(x[i, :, r : r + 3, c : c + 3].reshape(-1) for r in range(3) for c in range(3)) / 9
        )
        want_a += torch.outer(mean, mean) / 3
        for k in range(u.shape[0]):
            s = sum(u[k, i, p] for p in range(9))
            want_g += torch.outer(s, s) / 3
    torch.testing.assert_close(got.A.dense(), want_a, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(got.G.dense(), want_g, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("variant", ["expand", "reduce"])
def test_kfac_equals_curvlinops(variant: str) -> None:
    """curvlinops' ``KFACLinearOperator`` (type-2 Fisher = the exact GGN factors) of the mean CE
    on a conv / pool / linear net (a dev-only peer: ``pip install --no-deps
    curvlinops-for-pytorch einops einconv linear_operator``)."""
    curvlinops = pytest.importorskip("curvlinops")
    torch.manual_seed(15)
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Conv2d(3, 4, 2), nn.Tanh(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5),
    ).double().eval()  # fmt: skip
    g = torch.Generator().manual_seed(15)
    x, y = torch.randn(6, 2, 6, 6, generator=g, dtype=DT), torch.randint(0, 5, (6,), generator=g)
    ours = kronecker_factors(model, x, y, kind=variant)
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    op = curvlinops.KFACLinearOperator(
        model, nn.CrossEntropyLoss(), weights, [(x, y)], fisher_type="type-2",
        kfac_approx=variant, check_deterministic=False,
    )  # fmt: skip
    op.compute_kronecker_factors()
    assert set(ours.layers) == {"0", "2", "6"}
    for name, layer in ours.layers.items():
        theirs = torch.kron(op._gradient_covariances[name], op._input_covariances[name])
        torch.testing.assert_close(kron(layer.factors[variant]), theirs, rtol=1e-12, atol=1e-15)


def test_auto_chooses_reduce_for_pooled_outputs_and_lists_what_it_does_not_cover() -> None:
    g = torch.Generator().manual_seed(16)
    torch.manual_seed(16)
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2)).double()
    x, y = torch.randn(4, 3, generator=g, dtype=DT), torch.tensor([0, 1, 1, 0])
    got = kronecker_factors(model, x, y)
    assert "reduce" in got.choice and {la.chosen for la in got.layers.values()} == {"reduce"}
    assert set(got.layers) == {"0", "2"} and "LayerNorm" in got.not_covered["1"]
    with pytest.raises(FathomError, match="did you mean 'expand'"):
        kronecker_factors(model, x, y, kind="expnad")
