"""KFAC factors of the CE GGN for ``Linear`` and ``Conv2d``, exact spectra, and what they cost.

A covered layer is seen as ``P`` weight-sharing positions per example: for ``nn.Linear`` every
leading dimension between the batch and the features (a sequence: ``P = T``; none: ``P = 1``),
for ``nn.Conv2d`` every output pixel (``P = H_out W_out``) with ``a_ip`` the unfolded input
patch (``C_in k_h k_w`` entries, ``torch.nn.functional.unfold`` order, matching
``weight.reshape(C_out, -1)``). With ``u_ikp = J_{z_p,i}^T s_ik`` the exact pulled-back GGN
directions (``s_ik`` the ``K = C`` square-root columns of the softmax Hessian) and means over
the ``N`` probe examples (weights only; biases are not part of KFAC)::

    A = (1/N) sum_i sum_p a_ip a_ip^T                    [d_in, d_in]   summed over positions
    G = (1/N) sum_i sum_k (1/P) sum_p u_ikp u_ikp^T      [d_out, d_out] mean over positions
    KFAC GGN block  = G (x) A                            (row-major vec(W): g = u (x) a)

This is the KFC convention of Grosse & Martens (2016) for convolutions (``Omega`` summed,
``Gamma`` averaged over the spatial positions), which is also KFAC-expand for a Linear
layer applied at ``P`` positions; with ``P = 1`` it is the usual KFAC. It is exact on a
single datum with a single position (the exact block is ``sum_k (u_k u_k^T) (x) (a a^T)``),
and for every ``N`` whenever the pulled-back directions do not depend on the example (a deep
linear net under an example-independent output curvature, e.g. the logit-Jacobian Gram).
For ``N > 1`` or ``P > 1`` it assumes the expectation factorizes and positions decorrelate.

A factor is kept either explicitly or as its rows (``M = R^T R / s``), whichever is smaller,
so a 2,500-wide Ciresan layer never forms a 2,500 x 2,500 matrix it does not need.
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


def gram_spectrum(x: torch.Tensor, n: float) -> Spectrum:
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


@dataclass(frozen=True)
class Factor:
    """A PSD Kronecker factor ``M = R^T R / scale`` from its ``rows R [r, d]``.

    ``matrix`` is ``M`` itself when ``d <= r`` (cheaper to keep), else ``None`` and products
    go through the rows: ``x M = (x R^T) R / scale``.
    """

    rows: torch.Tensor
    scale: float
    matrix: torch.Tensor | None

    @staticmethod
    def of(rows: torch.Tensor, scale: float) -> Factor:
        r, d = rows.shape
        return Factor(rows, scale, rows.T @ rows / scale if d <= r else None)

    def dense(self) -> torch.Tensor:
        """``M`` as a ``[d, d]`` matrix (formed on demand)."""
        return self.matrix if self.matrix is not None else self.rows.T @ self.rows / self.scale

    def diagonal(self) -> torch.Tensor:
        """``diag(M) = sum_r R_r^2 / scale``."""
        return self.rows.square().sum(0) / self.scale

    def right(self, x: torch.Tensor) -> torch.Tensor:
        """``x M`` for ``x [..., d]`` (``M`` symmetric, so also ``(M x^T)^T``)."""
        if self.matrix is not None:
            return x @ self.matrix
        return (x @ self.rows.T) @ self.rows / self.scale

    def spectrum(self) -> Spectrum:
        return gram_spectrum(self.rows, self.scale)


@dataclass(frozen=True)
class KroneckerFactors:
    """``A`` (inputs) and ``G`` (output directions) of one layer; see the module docstring."""

    A: Factor
    G: Factor
    positions: int


def kfac_factors(u: torch.Tensor, a: torch.Tensor) -> KroneckerFactors:
    """Factors from directions ``u [K, N, P, d_out]`` and inputs ``a [N, P, d_in]``.

    ``[K, N, d_out]`` / ``[N, d_in]`` (one position) are accepted too.
    """
    if a.dim() == 2:
        a, u = a[:, None, :], u[:, :, None, :]
    n, p = a.shape[0], a.shape[1]
    return KroneckerFactors(
        A=Factor.of(a.reshape(-1, a.shape[-1]), n),
        G=Factor.of(u.reshape(-1, u.shape[-1]), n * p),
        positions=p,
    )


def kfac_diagonal(f: KroneckerFactors) -> torch.Tensor:
    """``diag(G) (x) diag(A)`` as ``[d_out, d_in]``."""
    return f.G.diagonal()[:, None] * f.A.diagonal()[None, :]


def relative_l1_error(approx: torch.Tensor, exact: torch.Tensor) -> float | None:
    """``sum |approx - exact| / sum |exact|``; ``None`` when the exact diagonal is zero."""
    denom = float(exact.abs().sum())
    return float((approx - exact).abs().sum()) / denom if denom > 0 else None


def kfac_quadratic(g: torch.Tensor, f: KroneckerFactors) -> float:
    """``vec(g)^T (G (x) A) vec(g) = <G g A, g>`` for a ``[d_out, d_in]`` weight direction ``g``."""
    ga = f.A.right(g)  # g A
    gga = f.G.right(ga.T).T  # G g A
    return float((gga * g).sum())


def exact_ggn_quadratic(g: torch.Tensor, u: torch.Tensor, a: torch.Tensor) -> float:
    """Exact CE-GGN layer block along ``g``: ``(1/N) sum_ik (sum_p u_ikp^T g a_ip)^2``.

    Shapes as :func:`kfac_factors`; for comparison with :func:`kfac_quadratic`.
    """
    if a.dim() == 2:
        a, u = a[:, None, :], u[:, :, None, :]
    ga = a @ g.T  # [N, P, d_out]: g a_ip
    proj = torch.einsum("kipo,ipo->ki", u, ga)
    return float(proj.square().sum()) / a.shape[0]


def per_example_kfac_curvatures(
    delta: torch.Tensor, a: torch.Tensor, f: KroneckerFactors
) -> list[float | None]:
    """KFAC directional curvature along each example's own gradient, ``[N]`` values.

    ``g_i = sum_p delta_ip a_ip^T`` (the observed-label CE gradient of example ``i`` in the
    layer's weight, ``delta_ip = dCE_i/dz_ip``)::

        q_i = vec(g_i)^T (G (x) A) vec(g_i) / ||g_i||^2
            = sum_pq (delta_ip^T G delta_iq)(a_iq^T A a_ip) / sum_pq (delta_ip.delta_iq)(a_iq.a_ip)

    (``(delta^T G delta)(a^T A a) / (|delta|^2 |a|^2)`` with one position). ``None`` where
    ``g_i = 0``. Shapes: ``delta [N, P, d_out]``, ``a [N, P, d_in]`` (or without ``P``).
    """
    if a.dim() == 2:
        a, delta = a[:, None, :], delta[:, None, :]
    dgd = f.G.right(delta) @ delta.transpose(1, 2)  # [N, P, P]
    aaa = f.A.right(a) @ a.transpose(1, 2)
    num = (dgd * aaa.transpose(1, 2)).sum((1, 2))
    den = ((delta @ delta.transpose(1, 2)) * (a @ a.transpose(1, 2)).transpose(1, 2)).sum((1, 2))
    return [float(q / s) if s > 0 else None for q, s in zip(num, den, strict=True)]
