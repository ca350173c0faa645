"""KFAC factors of the CE GGN, their exact spectra, and what the Kronecker approximation costs.

For affine layer ``l`` (weights only; biases excluded from KFAC), with ``u_ik = J_{z_l,i}^T s_ik``
the pulled-back GGN directions (``s_ik`` the exact square-root columns of the softmax Hessian)
and the mean over the N probe examples::

    A = (1/N) sum_i a_i a_i^T                       ([d_in, d_in], uncentered second moment)
    G = (1/N) sum_i sum_k u_ik u_ik^T               ([d_out, d_out])
    KFAC GGN block  = G (x) A                        (row-major vec(W), so g = u (x) a)

On a single datum (N = 1) the exact GGN block ``sum_k (u_k u_k^T) (x) (a a^T)`` equals
``G (x) A``; for N > 1 KFAC assumes the expectation factorizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Spectrum:
    """Eigenvalues (descending) of a PSD matrix ``M = X^T X / n`` and how they were found.

    ``values`` holds ``min(rows, dim)`` eigenvalues; the remaining ``dim - len(values)``
    eigenvalues of ``M`` are exactly zero (rank bound), stated by ``implied_zeros``.
    """

    values: torch.Tensor
    dim: int
    implied_zeros: int
    solver: str


def gram_spectrum(x: torch.Tensor, n: int) -> Spectrum:
    """Exact spectrum of ``M = x^T x / n`` for ``x [rows, dim]``, via the smaller Gram.

    When ``rows < dim`` the nonzero eigenvalues of ``x^T x`` equal those of ``x x^T``, so
    ``eigvalsh`` runs on the ``rows x rows`` Gram; otherwise on ``M`` itself.
    """
    rows, dim = x.shape
    if rows < dim:
        values = torch.linalg.eigvalsh(x @ x.T / n)
        solver = f"torch.linalg.eigvalsh of the {rows}x{rows} Gram (x x^T / N); {dim - rows} zeros implied"
    else:
        values = torch.linalg.eigvalsh(x.T @ x / n)
        solver = f"torch.linalg.eigvalsh of the {dim}x{dim} factor (x^T x / N)"
    return Spectrum(values.flip(0), dim, max(dim - rows, 0), solver)


def effective_rank(values: torch.Tensor) -> float | None:
    """``exp(-sum_j q_j log q_j)`` with ``q = lambda / sum(lambda)`` over ``lambda > 0``.

    Eigenvalues below zero (rounding of a PSD matrix) are treated as zero. ``None`` when the
    spectrum is entirely zero. Ranges from 1 (one direction) to the number of eigenvalues.
    """
    lam = values.clamp_min(0.0)
    total = lam.sum()
    if not total > 0:
        return None
    q = lam[lam > 0] / total
    return float(torch.exp(-(q * q.log()).sum()))


def kfac_factors(u: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, G)`` for ``u [K, N, d_out]`` (GGN directions) and ``a [N, d_in]``; see module docstring."""
    n = a.shape[0]
    b = u.reshape(-1, u.shape[-1])
    return a.T @ a / n, b.T @ b / n


def kfac_spectra(u: torch.Tensor, a: torch.Tensor) -> tuple[Spectrum, Spectrum]:
    """Exact spectra ``(A, G)`` without forming a factor larger than its Gram."""
    n = a.shape[0]
    return gram_spectrum(a, n), gram_spectrum(u.reshape(-1, u.shape[-1]), n)


def kfac_diagonal(u: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``diag(G) (x) diag(A)`` as ``[d_out, d_in]``: ``(1/N sum_ik u_iko^2)(1/N sum_i a_ij^2)``."""
    n = a.shape[0]
    diag_g = u.square().sum((0, 1)) / n
    diag_a = a.square().sum(0) / n
    return diag_g[:, None] * diag_a[None, :]


def relative_l1_error(approx: torch.Tensor, exact: torch.Tensor) -> float | None:
    """``sum |approx - exact| / sum |exact|``; ``None`` when the exact diagonal is zero."""
    denom = float(exact.abs().sum())
    return float((approx - exact).abs().sum()) / denom if denom > 0 else None


def kfac_quadratic(g_bar: torch.Tensor, u: torch.Tensor, a: torch.Tensor) -> float:
    """KFAC GGN quadratic form along ``W``-shaped ``g_bar``: ``vec(g)^T (G (x) A) vec(g) = <G g A, g>``.

    Computed as ``(1/N^2) sum_{i,k} sum_j (u_ik^T g a_j)^2`` so that no ``d x d`` factor is formed.
    """
    n = a.shape[0]
    ga = g_bar @ a.T  # [d_out, N]: column j is g a_j
    proj = torch.einsum("kio,oj->kij", u, ga)  # u_ik^T g a_j
    return float(proj.square().sum()) / n**2


def exact_ggn_quadratic(g_bar: torch.Tensor, u: torch.Tensor, a: torch.Tensor) -> float:
    """Exact GGN layer-block quadratic form ``(1/N) sum_i sum_k (u_ik^T g a_i)^2`` (for comparison)."""
    n = a.shape[0]
    ga = g_bar @ a.T  # [d_out, N]
    proj = (u * ga.T[None]).sum(-1)  # [K, N]
    return float(proj.square().sum()) / n
