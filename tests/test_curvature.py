"""Exactness of fathom.curvature against brute-force float64 references built with torch.func."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

from fathom.curvature import (
    affine_chain,
    curvature_snapshot,
    effective_rank,
    exact_ggn_diagonal,
    gradient_concentration,
    gram_spectrum,
    output_mismatch,
    pullback,
    solve_lyapunov_on_support,
)
from fathom.curvature.exact import (
    LayerDirections,
    bias_diagonal,
    directions_from_jacobian_rows,
    ggn_directions,
    gradient_gram,
    layer_diagonals,
    unit_directions,
    weight_diagonal,
)
from fathom.curvature.kfac import (
    exact_ggn_quadratic,
    kfac_diagonal,
    kfac_factors,
    kfac_quadratic,
)
from fathom.curvature.softmax import (
    cross_entropy,
    label_residual,
    softmax_hessian,
    softmax_hessian_sqrt,
    softmax_parts,
)
from fathom.depth import find_branches
from fathom.errors import FathomError
from fathom.models.ciresan import CiresanMLP

torch.set_num_threads(1)
DT = torch.float64
TOL = 1e-10


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, rtol: float, what: str, scale: float | None = None
) -> None:
    """``|a - e| <= rtol * scale`` everywhere (``scale = max|e|``); report the worst entries if not."""
    actual, expected = actual.detach(), expected.detach()
    scale = float(expected.abs().max()) if scale is None else scale
    err = (actual - expected).abs()
    bad = err > rtol * max(scale, 1e-300)
    if bool(bad.any()):
        idx = bad.nonzero()[:5].tolist()
        rows = [
            f"{tuple(i)}: got {actual[tuple(i)].item():.17g}, want {expected[tuple(i)].item():.17g}"
            for i in idx
        ]
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} entries differ beyond rel {rtol} "
            f"(max rel {float(err.max()) / max(scale, 1e-300):.3g}); e.g.\n  " + "\n  ".join(rows)
        )


# -- test cases as data -------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    seed: int
    n: int
    features: int
    classes: int

    def model(self) -> nn.Module:
        torch.manual_seed(self.seed)
        if self.id == "plain_sequential":
            m = nn.Sequential(
                nn.Linear(self.features, 9),
                nn.ReLU(),
                nn.Linear(9, 7),
                nn.Tanh(),
                nn.Linear(7, self.classes),
            )
        elif self.id == "sequential_nobias":
            m = nn.Sequential(
                nn.Linear(self.features, 6, bias=False), nn.GELU(), nn.Linear(6, self.classes)
            )
        elif self.id == "crop_residual":
            m = CiresanMLP(
                widths=(9, 8, 7, 6, 5),
                in_features=self.features,
                classes=self.classes,
                input_scale=1.0,
            )
        elif self.id == "sd_dense_mode":
            m = CiresanMLP(
                widths=(9, 8, 7, 6, 5),
                in_features=self.features,
                classes=self.classes,
                recipe="sd_decreasing",
                input_scale=1.0,
            )
            for b, g in zip(find_branches(m), (0.0, 1.25, 0.0, 2.5), strict=True):
                b.gain = g  # a training-time draw; curvature must evaluate in dense mode anyway
        else:
            raise ValueError(self.id)
        return m.to(DT)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed + 1)
        x = torch.randn(self.n, self.features, generator=g, dtype=DT) * 1.5
        y = torch.randint(0, self.classes, (self.n,), generator=g)
        return x, y


CASES = [
    Case("plain_sequential", 0, 6, 5, 4),
    Case("sequential_nobias", 1, 5, 4, 3),
    Case("crop_residual", 2, 6, 5, 4),
    Case("sd_dense_mode", 3, 5, 5, 4),
]


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request) -> Case:
    return request.param


# -- brute-force references ---------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    ggn: torch.Tensor
    fisher: torch.Tensor
    jac: torch.Tensor
    offsets: dict[int, tuple[int, int]]  # id(param) -> (start, numel) in the flat vector


def brute_force(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Reference:
    """Materialize J [N, C, P] with torch.func, then GGN, empirical Fisher and Jacobian Gram."""
    model.eval()
    for b in find_branches(model):
        b.gain = 1.0
    names = [n for n, _ in model.named_parameters()]
    params = dict(model.named_parameters())
    shapes = [params[n].shape for n in names]
    sizes = [params[n].numel() for n in names]
    flat0 = torch.cat([params[n].detach().reshape(-1) for n in names])

    def logits_of(flat: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(flat, sizes)
        p = {n: c.reshape(s) for n, c, s in zip(names, chunks, shapes, strict=True)}
        return functional_call(model, p, (x,))

    jac = jacrev(logits_of)(flat0)  # [N, C, P]
    logits = logits_of(flat0).detach()
    n = x.shape[0]
    p = torch.softmax(logits, -1)
    h = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    r = p - torch.nn.functional.one_hot(y, logits.shape[1]).to(DT)
    g = torch.einsum("icp,ic->ip", jac, r)
    offsets, start = {}, 0
    for name, size in zip(names, sizes, strict=True):
        offsets[id(params[name])] = (start, size)
        start += size
    return Reference(
        ggn=torch.einsum("icp,icd,idq->pq", jac, h, jac) / n,
        fisher=g.T @ g / n,
        jac=torch.einsum("icp,icq->pq", jac, jac) / n,
        offsets=offsets,
    )


def block(mat: torch.Tensor, ref: Reference, param: torch.Tensor) -> torch.Tensor:
    s, k = ref.offsets[id(param)]
    return mat[s : s + k, s : s + k]


def diag_of(mat: torch.Tensor, ref: Reference, param: torch.Tensor) -> torch.Tensor:
    return block(mat, ref, param).diagonal().reshape(param.shape)


def layer_directions(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """``(chain, pullback, [LayerDirections per layer])`` as a snapshot computes them."""
    chain = affine_chain(model)
    pb = pullback(chain, x, unit_directions)
    parts = softmax_parts(pb.logits)
    return chain, pb, [directions_from_jacobian_rows(j, parts, y) for j in pb.directions]


# -- exact diagonals ----------------------------------------------------------------------


def test_diagonals_match_materialized_matrices(case: Case) -> None:
    model = case.model()
    x, y = case.data()
    snap = curvature_snapshot(model, x, y)
    ref = brute_force(model, x, y)
    chain = affine_chain(model)
    for name, lin, d in zip(chain.names, chain.layers, snap.diagonals, strict=True):
        for mat, got_w, got_b in (
            (ref.ggn, d.ggn_w, d.ggn_b),
            (ref.fisher, d.fisher_w, d.fisher_b),
            (ref.jac, d.jacobian_w, d.jacobian_b),
        ):
            assert_close(got_w, diag_of(mat, ref, lin.weight), TOL, f"{case.id}/{name}/weight")
            if lin.bias is None:
                assert got_b is None
            else:
                assert_close(got_b, diag_of(mat, ref, lin.bias), TOL, f"{case.id}/{name}/bias")
    weights = [lin.weight for lin in chain.layers]
    for key, mat in (
        ("ggn_weight_trace", ref.ggn),
        ("empirical_fisher_weight_trace", ref.fisher),
        ("jacobian_gram_weight_trace", ref.jac),
    ):
        want = sum(float(diag_of(mat, ref, w).sum()) for w in weights)
        assert snap.record["totals"][key] == pytest.approx(want, rel=TOL)


def test_exact_ggn_diagonal_alone_matches_snapshot(case: Case) -> None:
    model = case.model()
    x, y = case.data()
    snap = curvature_snapshot(model, x, y)
    alone = exact_ggn_diagonal(model, x)
    for (w, b), d in zip(alone, snap.diagonals, strict=True):
        assert_close(w, d.ggn_w, 1e-13, "ggn weight diagonal")
        assert (b is None) == (d.ggn_b is None)


def test_dense_mode_is_used_and_gains_are_restored() -> None:
    case = CASES[3]
    model = case.model()
    x, y = case.data()
    gains = [b.gain for b in find_branches(model)]
    model.train()
    got = curvature_snapshot(model, x, y).record["totals"]["ggn_weight_trace"]
    assert [b.gain for b in find_branches(model)] == gains
    assert model.training
    for b in find_branches(model):
        b.gain = 1.0
    dense = curvature_snapshot(model, x, y).record["totals"]["ggn_weight_trace"]
    assert got == pytest.approx(dense, rel=1e-14)


def test_tap_logits_equal_model_output(case: Case) -> None:
    model = case.model()
    x, _ = case.data()
    pb = pullback(affine_chain(model), x, unit_directions)
    model.eval()
    for b in find_branches(model):
        b.gain = 1.0
    torch.testing.assert_close(pb.logits, model(x).detach(), rtol=0, atol=0)


@pytest.mark.parametrize("logit_scale", [1.0, 300.0])
def test_jacobian_row_route_equals_direct_pullback(case: Case, logit_scale: float) -> None:
    """GGN/Fisher directions by linearity from Jacobian rows = pulling back s_ik and r_i directly.

    At ``logit_scale = 300`` the probe is saturated (1 - p_y far below 1e-12), where a naive
    ``j_k - jbar`` or ``1 - p`` would lose every digit.
    """
    model = case.model()
    x, y = case.data()
    chain = affine_chain(model)
    with torch.no_grad():
        chain.layers[-1].weight.mul_(logit_scale)
    _, pb, dirs = layer_directions(model, x, y)
    direct = pullback(chain, x, ggn_directions)
    resid = pullback(chain, x, lambda z: label_residual(softmax_parts(z), y)[None])
    if logit_scale > 1:
        assert float(softmax_parts(pb.logits).one_minus_p.min()) < 1e-12
    for d, u, r, a in zip(dirs, direct.directions, resid.directions, pb.inputs, strict=True):
        assert_close(weight_diagonal(d.ggn, a), weight_diagonal(u, a), TOL, "GGN diag, two routes")
        assert_close(bias_diagonal(d.ggn), bias_diagonal(u), TOL, "GGN bias diag, two routes")
        assert_close(d.fisher, r[0], TOL, "Fisher direction, two routes")


# -- softmax pieces ------------------------------------------------------------------------


def test_hessian_square_root_factor() -> None:
    z = torch.randn(7, 5, dtype=DT, generator=torch.Generator().manual_seed(5)) * 4
    parts = softmax_parts(z)
    s = softmax_hessian_sqrt(parts)
    h = softmax_hessian(parts)
    assert_close(s @ s.transpose(1, 2), h, 1e-14, "S S^T = H")
    p = torch.softmax(z, -1)
    assert_close(h, torch.diag_embed(p) - p[:, :, None] * p[:, None, :], 1e-13, "H")
    assert_close(parts.p, p, 1e-14, "p")


def test_cancellation_resistant_ce_and_complement() -> None:
    z = torch.tensor([[0.0, -50.0, -60.0], [40.0, 0.0, 0.0]], dtype=DT)
    y = torch.tensor([0, 0])
    parts = softmax_parts(z)
    tail = math.exp(-50) + math.exp(-60)
    assert float(parts.one_minus_p[0, 0]) == pytest.approx(tail / (1 + tail), rel=1e-14)
    ce = cross_entropy(z, y)
    assert float(ce[0]) == pytest.approx(math.log1p(tail), rel=1e-14)
    assert float(ce[1]) == pytest.approx(math.log1p(2 * math.exp(-40)), rel=1e-14)
    naive = torch.nn.functional.cross_entropy(z, y, reduction="none")
    assert float(naive[0]) == 0.0  # what the cancellation-resistant form avoids
    r = label_residual(parts, y)
    assert float(r[0, 0]) == pytest.approx(-tail / (1 + tail), rel=1e-14)


# -- KFAC ------------------------------------------------------------------------------------


def test_kfac_equals_exact_ggn_block_on_single_datum(case: Case) -> None:
    model = case.model()
    x, y = case.data()
    x, y = x[:1], y[:1]
    chain, pb, dirs = layer_directions(model, x, y)
    ref = brute_force(model, x, y)
    for lin, d, a in zip(chain.layers, dirs, pb.inputs, strict=True):
        big_a, big_g = kfac_factors(d.ggn, a)
        assert_close(
            torch.kron(big_g, big_a), block(ref.ggn, ref, lin.weight), TOL, "KFAC block, N=1"
        )


def test_kfac_diagonal_quadratic_and_spectra_against_full_factors(case: Case) -> None:
    model = case.model()
    x, y = case.data()
    chain, pb, dirs = layer_directions(model, x, y)
    ref = brute_force(model, x, y)
    for lin, d, a in zip(chain.layers, dirs, pb.inputs, strict=True):
        ug = d.ggn
        big_a, big_g = kfac_factors(ug, a)
        kron = torch.kron(big_g, big_a)
        assert_close(
            kfac_diagonal(ug, a), kron.diagonal().reshape(lin.weight.shape), 1e-13, "KFAC diag"
        )
        g_bar = torch.randn(lin.weight.shape, dtype=DT, generator=torch.Generator().manual_seed(9))
        v = g_bar.reshape(-1)
        assert kfac_quadratic(g_bar, ug, a) == pytest.approx(float(v @ kron @ v), rel=1e-12)
        exact_block = block(ref.ggn, ref, lin.weight)
        assert exact_ggn_quadratic(g_bar, ug, a) == pytest.approx(
            float(v @ exact_block @ v), rel=1e-10
        )
        n = a.shape[0]
        for factor, rows in ((big_a, a), (big_g, ug.reshape(-1, ug.shape[-1]))):
            spec = gram_spectrum(rows, n)
            full = np.sort(np.linalg.eigvalsh(factor.numpy()))[::-1]
            k = len(spec.values)
            np.testing.assert_allclose(spec.values.numpy(), full[:k], rtol=0, atol=1e-12 * full[0])
            assert spec.implied_zeros == factor.shape[0] - k
            assert np.all(np.abs(full[k:]) <= 1e-12 * full[0])
            assert ("Gram" in spec.solver) == (rows.shape[0] < rows.shape[1])


def test_kfac_diagonal_error_is_reported_and_zero_when_exact() -> None:
    model = CASES[0].model()
    x, y = CASES[0].data()
    one = curvature_snapshot(model, x[:1], y[:1]).record
    many = curvature_snapshot(model, x, y).record
    for layer in one["layers"]:
        assert layer["kfac"]["kfac_diag_rel_l1_error"] == pytest.approx(0.0, abs=1e-13)
        assert layer["kfac"]["kfac_rayleigh_mean_gradient"] == pytest.approx(
            layer["kfac"]["exact_ggn_rayleigh_mean_gradient"], rel=1e-12
        )
    assert any(layer["kfac"]["kfac_diag_rel_l1_error"] > 1e-6 for layer in many["layers"])


# -- effective rank, spectra --------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, 1.0, 1.0, 1.0], 4.0),
        ([3.0, 0.0, 0.0], 1.0),
        ([0.5, 0.25, 0.25], 2**1.5),
        ([2.0, 2.0, -1e-18], 2.0),
    ],
)
def test_effective_rank_on_known_spectra(values: list[float], expected: float) -> None:
    assert effective_rank(torch.tensor(values, dtype=DT)) == pytest.approx(expected, rel=1e-14)


def test_effective_rank_of_zero_spectrum_is_none() -> None:
    assert effective_rank(torch.zeros(3, dtype=DT)) is None


# -- output-space mismatch ----------------------------------------------------------------


def test_lyapunov_solution_by_substitution_on_support() -> None:
    g = torch.Generator().manual_seed(11)
    q, _ = torch.linalg.qr(torch.randn(5, 5, dtype=DT, generator=g))
    lam = torch.tensor([3.0, 1.0, 0.5, 0.2, 0.0], dtype=DT)
    h = q @ torch.diag(lam) @ q.T
    m = torch.randn(5, 5, dtype=DT, generator=g)
    f = m @ m.T
    sol = solve_lyapunov_on_support(h, f)
    assert sol.support_dim == 4
    p = sol.basis @ sol.basis.T
    assert_close(h @ sol.L + sol.L @ h, 2 * p @ f @ p, 1e-12, "H L + L H = 2 P F P")
    null = q[:, 4]
    assert_close(
        sol.L @ null,
        torch.zeros(5, dtype=DT),
        1e-12,
        "L is zero on the null direction",
        scale=float(sol.L.abs().max()),
    )
    want = float(torch.linalg.matrix_norm(f - p @ f @ p) / torch.linalg.matrix_norm(f))
    assert want > 0.01
    assert sol.discarded_fisher_rel_norm == pytest.approx(want, rel=1e-12)
    hp = torch.linalg.pinv(h, hermitian=True)
    nonzero = torch.linalg.eigvals(p @ f @ p @ hp).real.sort(descending=True).values[:4]
    assert_close(
        sol.preconditioned_fisher_eigs, nonzero, 1e-10, "cheap rho spectrum = eig(P F P H^+)"
    )


def test_output_mismatch_from_logits() -> None:
    g = torch.Generator().manual_seed(12)
    z = torch.randn(30, 4, dtype=DT, generator=g) * 3
    y = torch.randint(0, 4, (30,), generator=g)
    rec = output_mismatch(z, y)
    assert rec["support_dim"] == 3  # the constant shift is always null
    assert rec["discarded_fisher_rel_norm"] < 1e-13
    assert rec["lyapunov_rel_residual"] < 1e-13
    assert rec["rho"] == pytest.approx(
        4 / effective_rank(torch.tensor(rec["L_eigenvalues"], dtype=DT)), rel=1e-14
    )
    assert 4 / 3 - 1e-12 <= rec["rho"] <= 4.0 + 1e-12
    assert rec["cheap_rho"] is not None


# -- gradient concentration ---------------------------------------------------------------


def test_gradient_concentration_known_cases() -> None:
    n = 8
    g = torch.zeros(n, 6, dtype=DT)
    g[3] = torch.arange(6, dtype=DT) + 1
    one = gradient_concentration(g @ g.T)
    assert one["covariance_to_mean_ratio"] == pytest.approx(n - 1, rel=1e-13)
    assert one["norm_participation"] == pytest.approx(1.0, rel=1e-14)
    same = gradient_concentration(torch.ones(n, n, dtype=DT))
    assert same["covariance_to_mean_ratio"] == pytest.approx(0.0, abs=1e-14)
    assert same["norm_participation"] == pytest.approx(n, rel=1e-14)
    zero = gradient_concentration(torch.zeros(n, n, dtype=DT))
    assert zero["covariance_to_mean_ratio"] is None and zero["norm_participation"] is None


def test_gradient_gram_matches_per_example_gradients() -> None:
    case = CASES[2]
    model = case.model()
    x, y = case.data()
    chain, pb, dirs = layer_directions(model, x, y)
    lin = chain.layers[1]
    model.eval()

    def loss_i(w: torch.Tensor, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, {"blocks.0.res.branch.weight": w}, (xi[None],), strict=False)
        return torch.nn.functional.cross_entropy(out, yi[None])

    per = torch.func.vmap(torch.func.grad(loss_i), in_dims=(None, 0, 0))(lin.weight.detach(), x, y)
    flat = per.reshape(x.shape[0], -1)
    gram = gradient_gram(dirs[1].fisher, pb.inputs[1])
    assert_close(gram, flat @ flat.T, 1e-12, "per-example gradient Gram")


def test_layer_diagonals_without_bias_give_none() -> None:
    u = torch.randn(3, 4, 2, dtype=DT)
    a = torch.randn(4, 5, dtype=DT)
    d = layer_diagonals(LayerDirections(u, u[0], u), a, has_bias=False)
    assert d.ggn_b is None and d.fisher_b is None and d.jacobian_b is None


# -- refusals ---------------------------------------------------------------------------------


class Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_unsupported_model_type_is_named() -> None:
    with pytest.raises(FathomError, match="model type Custom"):
        affine_chain(Custom())


def test_unsupported_module_in_sequential_is_named() -> None:
    seq = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    with pytest.raises(FathomError, match=r"Sequential: module 1 is LayerNorm"):
        affine_chain(seq)


def test_parameters_outside_affine_layers_are_refused() -> None:
    model = CiresanMLP(widths=(6, 5), in_features=4, classes=3)
    model.temperature = nn.Parameter(torch.ones(1))
    with pytest.raises(FathomError, match="temperature"):
        affine_chain(model)


def test_subclass_of_supported_model_is_refused() -> None:
    class Tweaked(CiresanMLP):
        pass

    with pytest.raises(FathomError, match="model type Tweaked"):
        affine_chain(Tweaked(widths=(6, 5), in_features=4, classes=3))
