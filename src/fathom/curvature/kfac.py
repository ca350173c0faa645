"""KFAC factors of the CE GGN for ``Linear`` and ``Conv2d``, expand and reduce, exact spectra.

A covered layer is seen as ``P`` weight-sharing positions per example: for ``nn.Linear`` every
leading dimension between the batch and the features (a sequence: ``P = T``; none: ``P = 1``),
for ``nn.Conv2d`` every output pixel (``P = H_out W_out``) with ``a_ip`` the unfolded input
patch (``C_in k_h k_w`` entries, ``torch.nn.functional.unfold`` order, matching
``weight.reshape(C_out, -1)``). With ``u_ikp = J_{z_p,i}^T s_ik`` the exact pulled-back GGN
directions (``s_ik`` the ``K = C - 1`` columns of the reduced square-root factor of the
softmax Hessian, :func:`fathom.curvature.softmax.softmax_hessian_sqrt_reduced`: ``H_i =
sum_k s_ik s_ik^T``, so any square-root factor gives the same ``G``) and means over the ``N``
probe examples (weights only; biases are not part of KFAC), two variants
(Eschenhagen et al. 2023, "Kronecker-Factored Approximate Curvature for Modern Neural
Network Architectures")::

    expand:  A = (1/N) sum_i sum_p a_ip a_ip^T              [d_in, d_in]   summed over positions
             G = (1/N) sum_i sum_k (1/P) sum_p u_ikp u_ikp^T [d_out, d_out] mean over positions
    reduce:  A = (1/N) sum_i abar_i abar_i^T,  abar_i = (1/P) sum_p a_ip   (position mean)
             G = (1/N) sum_i sum_k gbar_ik gbar_ik^T, gbar_ik = sum_p u_ikp  (position sum)
    KFAC GGN block  = G (x) A                              (row-major vec(W): g = u (x) a)

*Expand* is the KFC convention of Grosse & Martens (2016) for convolutions (``Omega``
summed, ``Gamma`` averaged over the spatial positions) and KFAC-expand for a Linear layer at
``P`` positions (the setting where the positions reach the loss as separate outputs: a
sequence loss); with ``P = 1`` both variants are the usual KFAC. *Reduce* is the variant for
weight sharing reduced before the loss (conv + average pool, mean-pooled tokens: every
weight-sharing layer of a model with ``[N, C]`` outputs). Exact cases: both on a single datum
with a single position (the exact block is ``sum_k (u_k u_k^T) (x) (a a^T)``), and for every
``N`` whenever the pulled-back directions do not depend on the example (a deep linear net
under an example-independent output curvature, e.g. the logit-Jacobian Gram); reduce also on
a single datum with any ``P`` when the layer's positions are mean-pooled straight after it
(then ``u_ikp = u_ik / P`` for every ``p`` and the example's weight Jacobian rows are
``gbar_ik (x) abar_i``). Otherwise they assume the expectation factorizes (and, expand, that
positions decorrelate).

:func:`kronecker_factors` returns both or the one chosen by where the model reduces its
shared positions. A factor is kept either explicitly or as its rows (``M = R^T R / s``),
whichever is smaller, so a 2,500-wide Ciresan layer never forms a 2,500 x 2,500 matrix it
does not need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from fathom.curvature.exact import OutputDirections, Plan
from fathom.curvature.probe import probe_labels, pull_back
from fathom.curvature.twin import prepared
from fathom.errors import FathomError, with_suggestion
from fathom.seam.pex import linear_rows

KFAC_KINDS: dict[str, str] = {"linear": "Linear", "conv2d": "Conv2d"}
"""The seam's layer kinds KFAC covers (their weight), by the class name it reports."""
_KFAC_VARIANTS: tuple[str, ...] = ("expand", "reduce", "auto")


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
    variant: str = "expand"


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


def kfac_reduce_factors(u: torch.Tensor, a: torch.Tensor) -> KroneckerFactors:
    """KFAC-reduce factors from ``u [K, N, P, d_out]`` and ``a [N, P, d_in]`` (module
    docstring): ``A`` from the position-averaged inputs, ``G`` from the position-summed
    directions. ``[K, N, d_out]`` / ``[N, d_in]`` (one position: equal to expand) are accepted."""
    if a.dim() == 2:
        a, u = a[:, None, :], u[:, :, None, :]
    n, p = a.shape[0], a.shape[1]
    return KroneckerFactors(
        A=Factor.of(a.mean(1), n),
        G=Factor.of(u.sum(2).reshape(-1, u.shape[-1]), n),
        positions=p,
        variant="reduce",
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


# -- the public function: every covered layer's factors of a model ----------------------------
@dataclass(frozen=True)
class LayerKFAC:
    """One covered layer: its weight's name, ``P`` positions per example, the factors of each
    variant computed (``{"expand": ..., "reduce": ...}``) and ``chosen``, the one the model's
    reduction calls for (``None`` when both are returned, labelled, because the model keeps
    positions in its output)."""

    layer: str
    type_name: str
    weight: str
    positions: int
    factors: dict[str, KroneckerFactors]
    chosen: str | None


@dataclass(frozen=True)
class KFAC:
    """:func:`kronecker_factors`' result: covered layers by name, the others with the reason,
    and why the variant was chosen."""

    layers: dict[str, LayerKFAC]
    not_covered: dict[str, str]
    choice: str
    definitions: dict[str, str] = field(default_factory=dict)


def _resolve_variant(kind: object) -> str:
    if isinstance(kind, str) and kind in _KFAC_VARIANTS:
        return kind
    raise FathomError(
        with_suggestion(
            f"unknown KFAC variant {kind!r}: choose from {', '.join(_KFAC_VARIANTS)}",
            str(kind),
            _KFAC_VARIANTS,
        )
    )


def kronecker_factors(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    kind: Literal["expand", "reduce", "auto"] = "auto",
) -> KFAC:
    """KFAC factors ``A``, ``G`` of the CE GGN (float64, mean over the probe) of every
    ``nn.Linear`` / ``nn.Conv2d`` weight of ``model`` on ``(x, y)`` (module docstring).

    ``kind``: ``"expand"``, ``"reduce"``, or ``"auto"``: where the model reduces its shared
    positions decides. A model returning ``[N, C]`` has reduced every weight-sharing dimension
    before the loss (pooling, flattening into the head): ``"reduce"``, the variant for that
    setting. A model whose output keeps positions gets both, labelled (``chosen = None``).
    Every other parametrized layer is listed in :attr:`KFAC.not_covered`.
    """
    variant = _resolve_variant(kind)
    _, x64, seam = prepared(model, x)
    plan = Plan(("ggn",))

    def ggn_directions(z: torch.Tensor) -> torch.Tensor:  # [C - 1, N, C]: s_ik
        labels = probe_labels(y.to(z.device) if isinstance(y, torch.Tensor) else y, *z.shape)
        return plan.grad_outputs(z, OutputDirections.of(z, labels))

    pb = pull_back(seam, x64, ggn_directions)
    n = x64.shape[0]
    if variant == "auto":
        if pb.logits.dim() == 2:
            variants, chosen = ("reduce",), "reduce"
            choice = (
                "auto: the output is [N, C], so every weight-sharing dimension is reduced "
                "before the loss: KFAC-reduce"
            )
        else:
            variants, chosen = ("expand", "reduce"), None
            choice = "auto: the output keeps positions: both variants, labelled"
    else:
        variants, chosen, choice = (variant,), variant, f"{variant} requested"
    build = {"expand": kfac_factors, "reduce": kfac_reduce_factors}
    layers, skipped = {}, {}
    for layer in seam.layers:
        calls = pb.calls[layer.name]
        if layer.kind not in KFAC_KINDS or not calls:
            skipped[layer.name] = (
                f"{layer.type_name}: fathom's KFAC covers nn.Linear and nn.Conv2d weights"
                if calls
                else "not called on this probe"
            )
            continue
        a, u = linear_rows(layer, calls, pb.cotangents[layer.name], n, directions=True)
        weight = layer.qualified[layer.params.index("weight")]
        layers[layer.name] = LayerKFAC(
            layer.name,
            layer.type_name,
            weight,
            a.shape[1],
            {v: build[v](u, a) for v in variants},
            chosen,
        )
    return KFAC(layers, skipped, choice)
