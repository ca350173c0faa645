"""Exact per-layer diagonals by full enumeration of output directions, and gradient concentration.

Normalization: every matrix is a **mean over the N probe examples** (the curvature of the
mean CE over the probe). For affine layer ``l`` with input ``a_i`` and a set of output
directions ``v_ik`` pulled back to ``u_ik = J_{z_l,i}^T v_ik``, the weight-space vectors are
``u_ik a_i^T`` and the matrix ``M = (1/N) sum_i sum_k vec(u_ik a_i^T) vec(u_ik a_i^T)^T`` has

    diag_W(M)[o, j] = (1/N) sum_i (sum_k u_iko^2) a_ij^2       (weights, [d_out, d_in])
    diag_b(M)[o]    = (1/N) sum_i  sum_k u_iko^2               (biases, [d_out])

The three matrices differ only in their output directions:

* CE **GGN** ``(1/N) sum_i J_i^T H_i J_i``: ``v_ik = s_ik``, the ``C`` columns of the square-root
  factor of the softmax Hessian (exact, not sampled);
* **empirical Fisher** ``(1/N) sum_i g_i g_i^T`` (observed labels): one direction ``r_i = p_i - e_y``;
* **logit-Jacobian Gram** ``(1/N) sum_i sum_c J_ic^T J_ic``: ``v_ic = e_c``, the ``C`` unit logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fathom.curvature.chain import AffineChain, affine_chain, pullback
from fathom.curvature.softmax import label_residual, softmax_hessian_sqrt, softmax_parts


@dataclass(frozen=True)
class DirectionLayout:
    """Where each matrix's directions sit in the stacked ``[K, N, C]`` direction tensor."""

    ggn: slice
    fisher: slice
    jacobian: slice


def direction_layout(classes: int) -> DirectionLayout:
    """``[s_1..s_C | r | e_1..e_C]``: GGN, empirical Fisher, Jacobian Gram."""
    c = classes
    return DirectionLayout(slice(0, c), slice(c, c + 1), slice(c + 1, 2 * c + 1))


def curvature_directions(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The ``[2C+1, N, C]`` output directions in the order of :func:`direction_layout`."""
    n, c = logits.shape
    parts = softmax_parts(logits)
    s = softmax_hessian_sqrt(parts).permute(2, 0, 1)  # [k, i, c]
    r = label_residual(parts, labels)[None]
    e = torch.eye(c, dtype=logits.dtype, device=logits.device)[:, None, :].expand(c, n, c)
    return torch.cat([s, r, e], dim=0)


def ggn_directions(logits: torch.Tensor) -> torch.Tensor:
    """The ``C`` GGN directions alone, ``[C, N, C]`` (columns of the softmax-Hessian root)."""
    return softmax_hessian_sqrt(softmax_parts(logits)).permute(2, 0, 1)


def weight_diagonal(u: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``(1/N) sum_i (sum_k u_kio^2) a_ij^2`` for ``u [K, N, d_out]``, ``a [N, d_in]``."""
    return (u.square().sum(0)).T @ a.square() / a.shape[0]


def bias_diagonal(u: torch.Tensor) -> torch.Tensor:
    """``(1/N) sum_i sum_k u_kio^2`` for ``u [K, N, d_out]``."""
    return u.square().sum((0, 1)) / u.shape[1]


@dataclass(frozen=True)
class LayerDiagonals:
    """Exact diagonals of one affine layer; a ``*_b`` entry is ``None`` when it has no bias."""

    ggn_w: torch.Tensor
    fisher_w: torch.Tensor
    jacobian_w: torch.Tensor
    ggn_b: torch.Tensor | None
    fisher_b: torch.Tensor | None
    jacobian_b: torch.Tensor | None


def layer_diagonals(
    u: torch.Tensor, a: torch.Tensor, layout: DirectionLayout, has_bias: bool
) -> LayerDiagonals:
    """GGN, empirical-Fisher and Jacobian-Gram diagonals from one layer's pulled-back directions."""
    blocks = (u[layout.ggn], u[layout.fisher], u[layout.jacobian])
    w = [weight_diagonal(b, a) for b in blocks]
    b = [bias_diagonal(b) if has_bias else None for b in blocks]
    return LayerDiagonals(w[0], w[1], w[2], b[0], b[1], b[2])


def exact_ggn_diagonal(
    model: nn.Module | AffineChain, x: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Exact CE-GGN diagonal ``(weight [d_out, d_in], bias [d_out] or None)`` per affine layer.

    Mean over the N examples of ``x``; dense evaluation mode; computed in the model's dtype.
    The GGN does not depend on the labels.
    """
    chain = model if isinstance(model, AffineChain) else affine_chain(model)
    pb = pullback(chain, x, ggn_directions)
    return [
        (weight_diagonal(u, a), bias_diagonal(u) if lin.bias is not None else None)
        for u, a, lin in zip(pb.directions, pb.inputs, chain.layers, strict=True)
    ]


def gradient_gram(delta: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``K_ij = <g_i, g_j> = (delta_i . delta_j)(a_i . a_j)`` for ``g_i = delta_i a_i^T``, ``[N, N]``."""
    return (delta @ delta.T) * (a @ a.T)


def gradient_concentration(gram: torch.Tensor) -> dict[str, float | None]:
    """Concentration of per-example gradients ``g_i`` from their Gram ``K_ij = <g_i, g_j>``.

    * ``mean_gradient_sq_norm = ||gbar||^2 = 1^T K 1 / N^2`` with ``gbar = (1/N) sum_i g_i``;
    * ``covariance_trace = (1/N) sum_i ||g_i - gbar||^2 = tr(K)/N - ||gbar||^2`` (population, 1/N);
    * ``covariance_to_mean_ratio = covariance_trace / ||gbar||^2`` (equals N-1 when one example
      carries all the gradient; ``None`` when ``gbar = 0``);
    * ``norm_participation = (sum_i ||g_i||)^2 / sum_i ||g_i||^2`` in ``[1, N]`` (``None`` if all zero).
    """
    n = gram.shape[0]
    sq = gram.diagonal().clamp_min(0.0)
    mean_sq = float(gram.sum()) / n**2
    cov = float(sq.sum()) / n - mean_sq
    total_sq = float(sq.sum())
    return {
        "mean_gradient_sq_norm": mean_sq,
        "covariance_trace": cov,
        "covariance_to_mean_ratio": cov / mean_sq if mean_sq > 0 else None,
        "norm_participation": float(sq.sqrt().sum()) ** 2 / total_sq if total_sq > 0 else None,
    }
