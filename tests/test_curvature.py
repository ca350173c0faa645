"""Exactness of fathom.curvature against brute-force float64 references built with torch.func."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import nn
from torch.func import functional_call, jacrev

from fathom.curvature import (
    effective_rank,
    exact_diagonals,
    gradient_concentration,
    output_mismatch,
    solve_lyapunov_on_support,
)
from fathom.curvature.exact import OutputDirections
from fathom.curvature.kfac import kfac_factors
from fathom.curvature.probe import float64_copy, pull_back
from fathom.curvature.snapshot import curvature_snapshot
from fathom.depth import find_branches
from fathom.losses.softmax import (
    cross_entropy,
    label_residual,
    softmax_hessian,
    softmax_hessian_sqrt,
    softmax_parts,
)
from fathom.models.ciresan import CiresanMLP
from fathom.seam import discover
from fathom.seam.pex import linear_rows, per_example_grads

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


# -- exact diagonals ----------------------------------------------------------------------


def test_diagonals_match_materialized_matrices(case: Case) -> None:
    model = case.model()
    x, y = case.data()
    snap = curvature_snapshot(model, x, y)
    ref = brute_force(model, x, y)
    for name, param in model.named_parameters():
        for kind, mat in (
            ("ggn", ref.ggn),
            ("empirical_fisher", ref.fisher),
            ("jacobian_gram", ref.jac),
        ):
            got = snap.diagonals[kind][name]
            assert_close(got, diag_of(mat, ref, param), TOL, f"{case.id}/{name}/{kind}")
    weights = [p for n, p in model.named_parameters() if not n.endswith("bias")]
    for key, mat in (
        ("ggn_weight_trace", ref.ggn),
        ("empirical_fisher_weight_trace", ref.fisher),
        ("jacobian_gram_weight_trace", ref.jac),
    ):
        want = sum(float(diag_of(mat, ref, w).sum()) for w in weights)
        assert snap.record["totals"][key] == pytest.approx(want, rel=TOL)


def test_exact_diagonals_equal_the_snapshot_and_chunking_changes_nothing(case: Case) -> None:
    model = case.model()
    x, y = case.data()
    snap = curvature_snapshot(model, x, y)
    for chunk in (None, 2):
        alone = exact_diagonals(model, x, y, chunk_size=chunk)
        for kind, per in alone.items():
            for name, t in per.items():
                assert_close(t, snap.diagonals[kind][name], 1e-13, f"{kind}/{name} chunk {chunk}")


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


def test_snapshot_logits_equal_the_dense_model_output(case: Case) -> None:
    model = case.model()
    x, y = case.data()
    logits = curvature_snapshot(model, x, y).logits
    model.eval()
    for b in find_branches(model):
        b.gain = 1.0
    torch.testing.assert_close(logits, model(x).detach(), rtol=0, atol=0)


@pytest.mark.parametrize("logit_scale", [1.0, 300.0])
def test_jacobian_row_route_equals_direct_pullback(case: Case, logit_scale: float) -> None:
    """GGN/Fisher diagonals by linearity from Jacobian rows = pulling back s_ik and r_i directly.

    At ``logit_scale = 300`` the probe is saturated (1 - p_y far below 1e-12), where a naive
    ``j_k - jbar`` or ``1 - p`` would lose every digit.
    """
    model = case.model()
    x, y = case.data()
    head = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        head.weight.mul_(logit_scale)
    got = exact_diagonals(model, x, y)
    m64 = float64_copy(model)
    seam = discover(m64, x)
    with seam.capture() as calls, torch.enable_grad():
        logits = m64(x)
    parts = softmax_parts(logits.detach())
    if logit_scale > 1:
        assert float(parts.one_minus_p.min()) < 1e-12
    s = softmax_hessian_sqrt(parts).permute(2, 0, 1)  # [K, N, C]
    r = label_residual(parts, y)[None]
    cots = seam.cotangents(calls, logits, torch.cat([s, r]), directions=True)
    for layer in seam.layers:
        grads = per_example_grads(
            layer, calls[layer.name], cots[layer.name], x.shape[0], directions=True
        )
        for local, q in zip(layer.params, layer.qualified, strict=True):
            g = grads[local]
            ggn = g[:-1].square().sum((0, 1)) / x.shape[0]
            fisher = g[-1].square().sum(0) / x.shape[0]
            assert_close(got["ggn"][q], ggn, TOL, f"GGN diag of {q}, two routes")
            assert_close(got["empirical_fisher"][q], fisher, TOL, f"Fisher diag of {q}, two routes")


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
    ref = brute_force(model, x, y)
    m64 = float64_copy(model)
    seam = discover(m64, x)
    pb = pull_back(seam, x)
    dirs = OutputDirections.of(pb.logits, y)
    params = dict(model.named_parameters())
    for layer in seam.layers:
        a, u = linear_rows(
            layer, pb.calls[layer.name], pb.cotangents[layer.name], 1, directions=True
        )
        f = kfac_factors(torch.einsum("ick,cito->kito", dirs.sqrt_hessian, u), a)
        weight = params[layer.qualified[layer.params.index("weight")]]
        want = block(ref.ggn, ref, weight)
        assert_close(torch.kron(f.G.dense(), f.A.dense()), want, TOL, f"KFAC block {layer.name}")


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


def test_gradient_concentration_of_a_snapshot_matches_per_example_gradients(case: Case) -> None:
    model = case.model()
    x, y = case.data()
    rec = curvature_snapshot(model, x, y).record
    model.eval()
    for b in find_branches(model):
        b.gain = 1.0
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_i(p: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, p, (xi[None],))
        return torch.nn.functional.cross_entropy(out, yi[None])

    per = torch.func.vmap(torch.func.grad(loss_i), in_dims=(None, 0, 0))(params, x, y)
    weights = [n for n in params if not n.endswith("bias")]
    flat = torch.cat([per[n].reshape(x.shape[0], -1) for n in weights], 1)
    want = gradient_concentration(flat @ flat.T)
    for k, v in rec["gradient_concentration_all_weights"].items():
        assert v == pytest.approx(want[k], rel=1e-10), k


def test_gradient_concentration_against_per_example_vectors() -> None:
    """The Gram-based quantities equal their definitions computed from the vectors g_i."""
    g = torch.randn(7, 5, dtype=DT, generator=torch.Generator().manual_seed(3))
    got = gradient_concentration(g @ g.T)
    gbar = g.mean(dim=0)
    norms = g.norm(dim=1)
    cov = ((g - gbar) ** 2).sum(dim=1).mean()
    assert got["mean_gradient_sq_norm"] == pytest.approx(float(gbar @ gbar), rel=1e-13)
    assert got["covariance_trace"] == pytest.approx(float(cov), rel=1e-13)
    assert got["covariance_to_mean_ratio"] == pytest.approx(float(cov / (gbar @ gbar)), rel=1e-13)
    want_pr = float(norms.sum() ** 2 / (norms**2).sum())
    assert got["norm_participation"] == pytest.approx(want_pr, rel=1e-13)


@settings(max_examples=40)
@given(
    logits=arrays(
        np.float64,
        st.tuples(st.integers(1, 4), st.integers(1, 6)),
        elements=st.floats(-40, 40, allow_nan=False),
    )
)
@example(logits=np.array([[30.0, -30.0, 0.0]]))  # p_1 -> 1: no cancellation in |u|^2
def test_reduced_hessian_factor_has_rank_columns_and_is_exact(logits):
    """``R_i R_i^T = H_i = diag(p_i) - p_i p_i^T`` with ``C - 1`` columns (one class: ``C``),
    against the Hessian written out in float64."""
    from fathom.losses.softmax import softmax_hessian_sqrt_reduced

    z = torch.from_numpy(logits)
    parts = softmax_parts(z)
    r = softmax_hessian_sqrt_reduced(parts)
    c = z.shape[1]
    assert r.shape == (z.shape[0], c, max(c - 1, 1))
    p = torch.softmax(z, dim=1)
    want = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    assert float((r @ r.transpose(1, 2) - want).abs().max()) <= 1e-15


def test_snapshot_layer_paths_are_the_coverage_table_text() -> None:
    """Each layer record's ``path`` is the coverage table's wording (one source,
    :attr:`fathom.seam.types.Layer.path`), for fast, attention, op and generic layers."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from curvature_floor import TransformerBlock

    torch.manual_seed(0)
    model = TransformerBlock(vocab=11, length=4, dim=8, heads=2).double().eval()
    x, y = torch.randint(0, 11, (5, 4)), torch.randint(0, 10, (5,))
    record = curvature_snapshot(model, x, y).record
    paths = {la["name"]: la["path"] for la in record["layers"]}
    assert paths["<model>"].startswith("root operations") and paths["attn"] == "fast attention"
    for qualified, text in record["coverage"].items():
        layer = text.split(" (", 1)[0]
        assert text.endswith(f", {paths[layer]})"), (qualified, text, paths[layer])
