"""Output-space mismatch between CE curvature and observed-label gradient noise, over the logits.

With means over the N probe examples (``C`` classes)::

    Hbar = (1/N) sum_i (diag(p_i) - p_i p_i^T)        mean CE Hessian over the logits
    F    = (1/N) sum_i r_i r_i^T,  r_i = p_i - e_y     observed-label gradient second moment

Solve the Lyapunov equation ``Hbar L + L Hbar = 2 F`` on Hbar's numerical support. With
``Hbar = U diag(lambda) U^T`` and ``U_s`` the eigenvectors with ``lambda > rtol * lambda_max``::

    Ft = U_s^T F U_s,    Lt_ab = 2 Ft_ab / (lambda_a + lambda_b),    L = U_s Lt U_s^T

Null-direction convention: ``L`` is zero on Hbar's numerical null space, which always holds the
constant shift ``1/sqrt(C)`` (softmax ignores a common logit offset; ``F 1 = 0`` too). The
part of F outside the support is discarded and reported as
``||F - P F P||_F / ||F||_F`` with ``P = U_s U_s^T``. Both rho values use the ambient
dimension ``C`` (the null direction counts in the dimension, not in the effective rank):

    rho       = C / effective_rank(eig(L))
    cheap rho = C / effective_rank(eig(Hs^{-1/2} Ft Hs^{-1/2}))    (= nonzero eig of P F Hbar^+)

rho is scale invariant and is not a divergence threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fathom.curvature.kfac import effective_rank
from fathom.losses.softmax import label_residual, softmax_hessian, softmax_parts


def _output_moments(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Hbar, F)``, each ``[C, C]``, means over the N examples."""
    parts = softmax_parts(logits)
    n = logits.shape[0]
    r = label_residual(parts, labels)
    return softmax_hessian(parts).mean(0), r.T @ r / n


@dataclass(frozen=True)
class LyapunovSolution:
    """``L`` on Hbar's support (basis ``U_s`` as columns) and the discarded relative Fisher norm."""

    L: torch.Tensor
    basis: torch.Tensor
    support_dim: int
    discarded_fisher_rel_norm: float | None
    preconditioned_fisher_eigs: torch.Tensor
    rtol: float


def solve_lyapunov_on_support(
    h: torch.Tensor, f: torch.Tensor, rtol: float | None = None
) -> LyapunovSolution:
    """Solve ``h L + L h = 2 f`` on the numerical support of PSD ``h`` (module docstring).

    ``rtol`` defaults to ``C * eps`` of the dtype: eigenvalues ``<= rtol * lambda_max`` are null.
    """
    c = h.shape[0]
    rtol = c * torch.finfo(h.dtype).eps if rtol is None else rtol
    lam, vec = torch.linalg.eigh(h)
    keep = lam > rtol * lam.max().clamp_min(0.0)
    lam_s, u_s = lam[keep], vec[:, keep]
    ft = u_s.T @ f @ u_s
    lt = 2.0 * ft / (lam_s[:, None] + lam_s[None, :])
    big_l = u_s @ lt @ u_s.T
    projected = u_s @ ft @ u_s.T
    f_norm = float(torch.linalg.matrix_norm(f))
    discarded = float(torch.linalg.matrix_norm(f - projected)) / f_norm if f_norm > 0 else None
    inv_sqrt = lam_s.rsqrt()
    pre = inv_sqrt[:, None] * ft * inv_sqrt[None, :]
    return LyapunovSolution(
        L=big_l,
        basis=u_s,
        support_dim=int(keep.sum()),
        discarded_fisher_rel_norm=discarded,
        preconditioned_fisher_eigs=torch.linalg.eigvalsh(pre).flip(0),
        rtol=rtol,
    )


def output_mismatch(logits: torch.Tensor, labels: torch.Tensor, rtol: float | None = None) -> dict:
    """The mismatch record: rho, cheap rho, support, discarded Fisher, residual of the solve."""
    c = logits.shape[1]
    h, f = _output_moments(logits, labels)
    sol = solve_lyapunov_on_support(h, f, rtol)
    l_eigs = torch.linalg.eigvalsh(sol.L).flip(0)
    erank_l = effective_rank(l_eigs)
    erank_pre = effective_rank(sol.preconditioned_fisher_eigs)
    rhs = h @ sol.L + sol.L @ h
    p = sol.basis @ sol.basis.T
    target = 2.0 * (p @ f @ p)
    t_norm = float(torch.linalg.matrix_norm(target))
    return {
        "matrices": "Hbar = mean CE Hessian over logits; F = mean observed-label gradient "
        "second moment over logits (r = p - e_y); means over the N probe examples",
        "equation": "Hbar L + L Hbar = 2 F on Hbar's numerical support",
        "null_direction_convention": "L = 0 on Hbar's numerical null space (contains the "
        "constant logit shift); rho uses the ambient dimension C",
        "classes": c,
        "support_dim": sol.support_dim,
        "support_rtol": sol.rtol,
        "discarded_fisher_rel_norm": sol.discarded_fisher_rel_norm,
        "lyapunov_rel_residual": float(torch.linalg.matrix_norm(rhs - target)) / t_norm
        if t_norm > 0
        else None,
        "hbar_eigenvalues": torch.linalg.eigvalsh(h).flip(0).tolist(),
        "fisher_trace": float(f.trace()),
        "L_eigenvalues": l_eigs.tolist(),
        "L_effective_rank": erank_l,
        "rho": c / erank_l if erank_l else None,
        "preconditioned_fisher_eigenvalues": sol.preconditioned_fisher_eigs.tolist(),
        "cheap_rho": c / erank_pre if erank_pre else None,
    }
