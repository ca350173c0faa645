"""One curvature snapshot: every quantity of :mod:`fathom.curvature` for one model and probe.

The model is evaluated in dense mode (``eval()``, every branch at gain one, dropout off) in
its own dtype (the CLI converts checkpoints to float64). One forward pass and one batched
backward of the ``C`` unit logit directions (the Jacobian rows) feed everything below.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from fathom.curvature.chain import affine_chain, pullback
from fathom.curvature.exact import (
    LayerDiagonals,
    directions_from_jacobian_rows,
    gradient_concentration,
    gradient_gram,
    layer_diagonals,
    unit_directions,
)
from fathom.curvature.kfac import (
    Spectrum,
    effective_rank,
    exact_ggn_quadratic,
    kfac_diagonal,
    kfac_quadratic,
    kfac_spectra,
    relative_l1_error,
)
from fathom.curvature.mismatch import output_mismatch
from fathom.curvature.softmax import cross_entropy, softmax_parts

NORMALIZATION = (
    "mean over the N probe examples: every matrix is (1/N) sum_i of per-example terms "
    "(the curvature of the mean CE over the probe); KFAC factors A and G are also (1/N) sums"
)

DEFINITIONS: dict[str, str] = {
    "ggn": "CE generalized Gauss-Newton (1/N) sum_i J_i^T H_i J_i, H_i = diag(p_i) - p_i p_i^T; "
    "estimator exact (full enumeration of the C columns of S_i = diag(sqrt p_i) - p_i sqrt(p_i)^T)",
    "empirical_fisher": "(1/N) sum_i g_i g_i^T with g_i the gradient of CE_i at the observed label; "
    "estimator exact",
    "jacobian_gram": "logit-Jacobian Gram (1/N) sum_i sum_c J_ic^T J_ic (no loss curvature); "
    "estimator exact",
    "kfac": "KFAC approximation G (x) A of the layer's CE-GGN weight block, A = (1/N) sum_i a_i a_i^T "
    "(uncentered), G = (1/N) sum_i sum_k u_ik u_ik^T from the same exact output directions; "
    "biases excluded",
    "activation_effective_rank": "effective rank of the layer input's uncentered second moment "
    "A = (1/N) sum_i a_i a_i^T (not a centered covariance)",
    "effective_rank": "exp of the spectral entropy: exp(-sum q log q), q = lambda / sum lambda",
    "kfac_rayleigh_mean_gradient": "KFAC quantity: vec(gbar)^T (G (x) A) vec(gbar) / ||gbar||^2 "
    "for gbar the layer's probe-mean CE gradient",
    "exact_ggn_rayleigh_mean_gradient": "exact CE-GGN layer block along the same gbar, for comparison",
    "kfac_diag_rel_l1_error": "sum |diag(G) (x) diag(A) - diag(GGN)| / sum |diag(GGN)| over the layer weights",
    "gradient_concentration": "per-example observed-label CE gradients g_i of the layer weights "
    "(biases excluded); covariance is the population one (1/N)",
    "traces": "weight traces sum the exact weight diagonals; bias traces are reported separately",
}


@dataclass(frozen=True)
class Snapshot:
    """The JSON-ready record and the exact diagonals (per layer) it was computed from."""

    record: dict
    diagonals: list[LayerDiagonals]


def _spectrum_record(spec: Spectrum) -> dict:
    return {
        "dim": spec.dim,
        "eigenvalues": spec.values.tolist(),
        "implied_zeros": spec.implied_zeros,
        "solver": spec.solver,
        "effective_rank": effective_rank(spec.values),
        "trace": float(spec.values.sum()),
    }


def _opt_trace(t: torch.Tensor | None) -> float | None:
    return None if t is None else float(t.sum())


def curvature_snapshot(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> Snapshot:
    """All curvature quantities of ``model`` on the probe ``(x, labels)``; see :data:`DEFINITIONS`."""
    t0 = time.perf_counter()
    chain = affine_chain(model)
    labels = labels.long().to(device=x.device)
    pb = pullback(chain, x, unit_directions)
    n, c = pb.logits.shape
    parts = softmax_parts(pb.logits)
    ce = cross_entropy(pb.logits, labels)

    layers: list[dict] = []
    diagonals: list[LayerDiagonals] = []
    gram_total = torch.zeros(n, n, dtype=pb.logits.dtype, device=pb.logits.device)
    for name, lin, u, a in zip(chain.names, chain.layers, pb.directions, pb.inputs, strict=True):
        has_bias = lin.bias is not None
        dirs = directions_from_jacobian_rows(u, parts, labels)
        d = layer_diagonals(dirs, a, has_bias)
        diagonals.append(d)
        u_ggn = dirs.ggn
        delta = dirs.fisher  # [N, d_out], dCE_i/dz_i
        g_bar = delta.T @ a / n  # probe-mean CE gradient of W
        g_sq = float(g_bar.square().sum())
        spec_a, spec_g = kfac_spectra(u_ggn, a)
        erank_a, erank_g = effective_rank(spec_a.values), effective_rank(spec_g.values)
        kfac_q = kfac_quadratic(g_bar, u_ggn, a)
        exact_q = exact_ggn_quadratic(g_bar, u_ggn, a)
        gram = gradient_gram(delta, a)
        gram_total += gram
        layers.append(
            {
                "name": name,
                "weight_shape": [lin.out_features, lin.in_features],
                "has_bias": has_bias,
                "ggn_weight_trace": float(d.ggn_w.sum()),
                "empirical_fisher_weight_trace": float(d.fisher_w.sum()),
                "jacobian_gram_weight_trace": float(d.jacobian_w.sum()),
                "ggn_bias_trace": _opt_trace(d.ggn_b),
                "empirical_fisher_bias_trace": _opt_trace(d.fisher_b),
                "jacobian_gram_bias_trace": _opt_trace(d.jacobian_b),
                "ggn_weight_diag_max": float(d.ggn_w.max()),
                "kfac": {
                    "A": _spectrum_record(spec_a),
                    "G": _spectrum_record(spec_g),
                    "kfac_effective_rank": erank_a * erank_g if erank_a and erank_g else None,
                    "kfac_effective_rank_note": "spectrum of G (x) A is all products; its "
                    "entropy is the sum, so its effective rank is erank(G) * erank(A)",
                    "kfac_diag_rel_l1_error": relative_l1_error(kfac_diagonal(u_ggn, a), d.ggn_w),
                    "kfac_quadratic_mean_gradient": kfac_q,
                    "kfac_rayleigh_mean_gradient": kfac_q / g_sq if g_sq > 0 else None,
                    "exact_ggn_rayleigh_mean_gradient": exact_q / g_sq if g_sq > 0 else None,
                    "mean_gradient_sq_norm": g_sq,
                },
                "activation_effective_rank": erank_a,
                "gradient_concentration": gradient_concentration(gram),
            }
        )

    def total(key: str) -> float:
        return sum(layer[key] for layer in layers)

    record = {
        "dtype": str(pb.logits.dtype).removeprefix("torch."),
        "mode": "dense evaluation: eval(), every branch at gain one, dropout off",
        "normalization": NORMALIZATION,
        "definitions": DEFINITIONS,
        "probe_size": n,
        "classes": c,
        "probe_ce_mean": float(ce.mean()),
        "probe_accuracy": float((pb.logits.argmax(1) == labels).double().mean()),
        "layers": layers,
        "totals": {
            "scope": "sum over all affine layers, weights only (biases excluded); off-diagonal "
            "blocks do not enter a trace",
            "ggn_weight_trace": total("ggn_weight_trace"),
            "empirical_fisher_weight_trace": total("empirical_fisher_weight_trace"),
            "jacobian_gram_weight_trace": total("jacobian_gram_weight_trace"),
        },
        "gradient_concentration_all_weights": gradient_concentration(gram_total),
        "output_mismatch": output_mismatch(pb.logits, labels),
    }
    record["compute_s"] = time.perf_counter() - t0
    return Snapshot(record, diagonals)
