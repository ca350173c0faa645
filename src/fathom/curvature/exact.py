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

A snapshot pulls back only the ``C`` unit directions and forms the other two by linearity
(:func:`directions_from_jacobian_rows`); :func:`exact_ggn_diagonal` pulls back the ``s_ik``
directly. Both are tested against each other and against materialized matrices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fathom.curvature.chain import AffineChain, affine_chain, pullback
from fathom.curvature.softmax import (
    SoftmaxParts,
    label_residual,
    softmax_hessian_sqrt,
    softmax_parts,
)


def unit_directions(logits: torch.Tensor) -> torch.Tensor:
    """The ``C`` unit logit directions ``e_c``, ``[C, N, C]``: their pullbacks are the Jacobian rows."""
    n, c = logits.shape
    return torch.eye(c, dtype=logits.dtype, device=logits.device)[:, None, :].expand(c, n, c)


@dataclass(frozen=True)
class LayerDirections:
    """One layer's pulled-back directions: GGN ``[C, N, d]``, Fisher ``[N, d]``, Jacobian ``[C, N, d]``."""

    ggn: torch.Tensor
    fisher: torch.Tensor
    jacobian: torch.Tensor


def directions_from_jacobian_rows(
    j: torch.Tensor, parts: SoftmaxParts, labels: torch.Tensor
) -> LayerDirections:
    """GGN and Fisher directions from the Jacobian rows ``j_ic = J_{z,i}^T e_c`` (``[C, N, d]``).

    By linearity ``J^T v = sum_c v_c j_c``, so with the cancellation-resistant coefficients of
    :mod:`fathom.curvature.softmax` (``1 - p`` from the complement, never ``1 - p`` formed)::

        u_ik     = J^T s_ik = sum_c S_i[c, k] j_ic    (S_i the square-root factor of H_i)
        delta_i  = J^T r_i  = sum_c r_ic j_ic         (r_i = p_i - e_y)

    One pullback of the ``C`` unit directions thus serves the GGN, the empirical Fisher and the
    Jacobian Gram; the extra work is a ``C x C`` mix per example and coordinate (``C^2 N d``),
    small next to the ``C N d d'`` pullback.
    """
    s = softmax_hessian_sqrt(parts)  # [i, c, k]
    r = label_residual(parts, labels)  # [i, c]
    ggn = torch.einsum("ick,cid->kid", s, j)
    fisher = torch.einsum("ic,cid->id", r, j)
    return LayerDirections(ggn=ggn, fisher=fisher, jacobian=j)


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


def layer_diagonals(dirs: LayerDirections, a: torch.Tensor, has_bias: bool) -> LayerDiagonals:
    """GGN, empirical-Fisher and Jacobian-Gram diagonals from one layer's pulled-back directions.

    The three ``[N, d_out]`` squared-direction sums are stacked so that a single matmul with
    ``a^2`` gives all three weight diagonals (see the module docstring for the formula).
    """
    n, d_out = a.shape[0], dirs.fisher.shape[1]
    sq = torch.cat(
        [dirs.ggn.square().sum(0), dirs.fisher.square(), dirs.jacobian.square().sum(0)], dim=1
    )
    w = (sq.T @ a.square() / n).split(d_out)
    b = (sq.sum(0) / n).split(d_out) if has_bias else (None, None, None)
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
