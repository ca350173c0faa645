"""Cancellation-resistant softmax cross-entropy pieces over the logits of one probe.

Everything is built from the complement logits ``t_ik = logsumexp_{c != k}(z_ic - z_ik)``::

    p_ik       = sigmoid(-t_ik)            (softmax probability)
    1 - p_ik   = sigmoid(t_ik)             (never formed as 1 - p: no cancellation at p -> 1)
    CE_i       = -log p_iy = logaddexp(0, t_iy)      (accurate when CE_i is ~1e-20)

The output-space objects per example ``i`` (``C`` classes, ``e_y`` the one-hot label):

* softmax Hessian of CE over the logits: ``H_i = diag(p_i) - p_i p_i^T`` (PSD, ``H_i 1 = 0``);
* its square-root factor ``S_i = diag(sqrt p_i) - p_i sqrt(p_i)^T`` with ``H_i = S_i S_i^T``,
  column ``k`` is ``s_ik = sqrt(p_ik) (e_k - p_i)``;
  proof: ``S S^T = diag(p) - 2 p p^T + p (sum_k p_k) p^T = diag(p) - p p^T`` since ``sum p = 1``;
* its rank is ``C - 1`` (``S_i sqrt(p_i) = (I - p 1^T) p = 0``), and the reduced factor
  ``R_i = S_i Q_i`` without its last column (``Q_i`` the Householder reflection with
  ``Q_i e_C = -sqrt(p_i)``, so that column is ``-S_i sqrt(p_i) = 0``) has ``C - 1`` columns and
  ``R_i R_i^T = S_i Q_i Q_i^T S_i^T = H_i``: one output direction fewer to pull back;
* the observed-label residual ``r_i = dCE_i/dz_i = p_i - e_y`` (its ``y`` entry is
  ``-(1 - p_iy)``, taken from the complement).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SoftmaxParts:
    """Per-example softmax quantities, each ``[N, C]``: probabilities and their complements."""

    p: torch.Tensor
    one_minus_p: torch.Tensor
    log_p: torch.Tensor


PAIRWISE_CLASSES = 64  # above: the linear-memory form (the pairwise one is [N, C, C])


def softmax_parts(logits: torch.Tensor) -> SoftmaxParts:
    """``p``, ``1 - p`` and ``log p`` from the complement logits (see the module docstring).

    Up to :data:`PAIRWISE_CLASSES` classes every ``t_ik`` is formed (``[N, C, C]``); above,
    :func:`_softmax_parts_linear` gives the same quantities in ``[N, C]`` memory (a
    vocabulary of tens of thousands)."""
    c = logits.shape[1]
    if c > PAIRWISE_CLASSES:
        return _softmax_parts_linear(logits)
    # diff[i, k, j] = z_ij - z_ik; drop j == k so t_ik sums over the other classes only
    diff = logits[:, None, :] - logits[:, :, None]
    same = torch.eye(c, dtype=torch.bool, device=logits.device)
    diff = diff.masked_fill(same, float("-inf"))
    t = torch.logsumexp(diff, dim=-1)
    return SoftmaxParts(
        p=torch.sigmoid(-t),
        one_minus_p=torch.sigmoid(t),
        log_p=-torch.logaddexp(torch.zeros_like(t), t),
    )


def _softmax_parts_linear(logits: torch.Tensor) -> SoftmaxParts:
    """:func:`softmax_parts` in ``[N, C]`` memory. At most one class per row has
    ``p > 1/2``, the row's top logit ``k*``: there ``1 - p`` would cancel, so ``p``, ``1 - p``
    and ``log p`` of ``k*`` come from its complement logit ``t = logsumexp_{j != k*}(z_j -
    z_k*)`` as in the module docstring; every other class has ``p <= 1/2``, where
    ``p = exp(z - logsumexp z)``, ``1 - p`` and ``log p = z - logsumexp z`` lose nothing."""
    log_p = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    p = log_p.exp()
    one_minus_p = 1.0 - p
    top = logits.argmax(dim=1, keepdim=True)
    others = (logits - logits.gather(1, top)).scatter(1, top, float("-inf"))
    t = torch.logsumexp(others, dim=1, keepdim=True)
    p = p.scatter(1, top, torch.sigmoid(-t))
    one_minus_p = one_minus_p.scatter(1, top, torch.sigmoid(t))
    log_p = log_p.scatter(1, top, -torch.logaddexp(torch.zeros_like(t), t))
    return SoftmaxParts(p=p, one_minus_p=one_minus_p, log_p=log_p)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example natural-log CE, ``[N]``: ``CE_i = logaddexp(0, t_iy)``."""
    log_p = softmax_parts(logits).log_p
    return -log_p.gather(1, labels.long()[:, None])[:, 0]


def softmax_hessian(parts: SoftmaxParts) -> torch.Tensor:
    """``H_i = diag(p_i) - p_i p_i^T``, ``[N, C, C]``; diagonal ``p (1 - p)`` from the complement."""
    p = parts.p
    h = -p[:, :, None] * p[:, None, :]
    h.diagonal(dim1=1, dim2=2).copy_(p * parts.one_minus_p)
    return h


def softmax_hessian_sqrt(parts: SoftmaxParts) -> torch.Tensor:
    """``S_i`` with ``H_i = S_i S_i^T``, ``[N, C, K=C]``; column ``k`` is ``sqrt(p_k)(e_k - p)``."""
    p = parts.p
    e_minus_p = -p[:, :, None].expand(-1, -1, p.shape[1]).clone()  # [i, c, k] = -p_ic
    e_minus_p.diagonal(dim1=1, dim2=2).copy_(parts.one_minus_p)  # c == k: 1 - p_ik
    return e_minus_p * p.sqrt()[:, None, :]


def softmax_hessian_sqrt_reduced(parts: SoftmaxParts) -> torch.Tensor:
    """``R_i`` with ``H_i = R_i R_i^T``, ``[N, C, C - 1]`` (``C >= 2``; one class: ``S_i``).

    ``Q_i = I - 2 u u^T / |u|^2`` with ``u = sqrt(p_i) + e_C`` (``|u|^2 = 2 + 2 sqrt(p_iC) >= 2``:
    no cancellation); ``S_i Q_i = S_i - 2 (S_i u) u^T / |u|^2``, last column dropped (zero).
    """
    s = softmax_hessian_sqrt(parts)
    if s.shape[-1] < 2:
        return s
    u = parts.p.sqrt().clone()
    u[:, -1] += 1.0
    su = s @ u[:, :, None]  # [N, C, 1]
    r = s - (2.0 / (u * u).sum(-1))[:, None, None] * su * u[:, None, :]
    return r[:, :, :-1]


def label_residual(parts: SoftmaxParts, labels: torch.Tensor) -> torch.Tensor:
    """``r_i = p_i - e_{y_i}``, ``[N, C]``, with the label entry ``-(1 - p_iy)``."""
    idx = labels.long()[:, None]
    r = parts.p.clone()
    r.scatter_(1, idx, -parts.one_minus_p.gather(1, idx))
    return r
