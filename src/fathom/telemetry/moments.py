"""Per-example gradient moments of an affine layer, without per-example gradients.

For an affine layer ``z_i = W a_i + b`` and per-example loss ``L_i`` (unaveraged
cross entropy of example ``i``), the per-example weight gradient is the outer product

    g_i = dL_i/dW = delta_i a_i^T,          delta_i = dL_i/dz_i.

Every moment below needs only inner products of ``g``'s, and those factor:

    g_i . g_j = (a_i . a_j) (delta_i . delta_j)        (Frobenius inner product)
    ||g_i||^2 = ||a_i||^2 ||delta_i||^2

so one ``N x N`` Gram matrix ``K = (A A^T) * (Delta Delta^T)`` (elementwise product)
holds them all, at cost ``N^2 (d_in + d_out)`` instead of the ``N d_in d_out`` of
materialising ``g``. With ``include_bias`` the bias is appended to the weights as a
column of ones in ``a`` (``a_i . a_j + 1``). All reductions run in float64.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from fathom.seam.pex import gradient_gram
from fathom.telemetry.gradient_fields import NORM_QUANTILES


@dataclass(frozen=True)
class GradientMoments:
    """Moments of the ``N`` per-example gradients ``g_i`` of one layer (``None`` = undefined).

    ``m = (1/N) sum_i g_i`` and ``S = (1/N) sum_i (g_i - m)(g_i - m)^T`` (plug-in, 1/N).
    """

    n: int
    mean_norm: float  # ||m||
    mean_sq_norm: float  # (1/N) sum_i ||g_i||^2
    diversity: float | None  # mean_sq_norm / ||m||^2
    max_share: float | None  # max_i ||g_i||^2 / sum_i ||g_i||^2
    participation: float | None  # (sum_i ||g_i||)^2 / sum_i ||g_i||^2, in [1, N]
    cos_cyclic_mean: float | None  # mean_i cos(g_i, g_{(i+1) mod N}) over defined pairs
    noise_scale: float | None  # tr(S) / ||m||^2
    cov_along_mean: float | None  # m^T S m / ||m||^4

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def _ratio(num: float, den: float) -> float | None:
    """``num / den``, or ``None`` when the denominator is zero (0/0 and x/0 are undefined)."""
    return None if den == 0.0 else num / den


def moments_from_grams(k: torch.Tensor) -> list[GradientMoments]:
    """All moments from per-example gradient Gram matrices ``K_ij = g_i . g_j``, batched.

    ``k`` has shape ``(layers, N, N)`` (or ``(N, N)`` for one layer). Steps, per layer
    (``N`` = probe size, ``s_i = ||g_i||^2 = K_ii``):

    * ``||m||^2 = (1/N^2) sum_ij K_ij``; ``m . g_i = (1/N) sum_j K_ij``;
    * ``D = mean_i s_i / ||m||^2`` (``N`` when a single example carries all the gradient);
    * energy share ``max_i s_i / sum_i s_i``; participation ``(sum_i sqrt(s_i))^2 / sum_i s_i``;
    * cyclic cosines ``K_{i,i+1} / sqrt(s_i s_{i+1})`` for ``i = 0..N-1`` (index mod ``N``),
      averaged over pairs where both norms are non-zero (``N = 1``: none);
    * ``tr(S) = mean_i s_i - ||m||^2``, so ``noise_scale = tr(S) / ||m||^2 = D - 1``
      (``N - 1`` for a single contributing example);
    * ``m^T S m = (1/N) sum_i (m . g_i - ||m||^2)^2``, reported over ``||m||^4``.
    """
    k = k.to("cpu", torch.float64)  # note: one device-to-host copy of the N x N matrices
    if k.dim() == 2:
        k = k.unsqueeze(0)
    n = int(k.shape[-1])
    s = torch.diagonal(k, dim1=1, dim2=2).clamp_min(0.0)
    mean_sq = (k.sum(dim=(1, 2)) / (n * n)).clamp_min(0.0)
    along = ((k.mean(dim=2) - mean_sq[:, None]) ** 2).mean(dim=1)
    idx = torch.arange(n)
    nxt = torch.roll(idx, -1)
    prod = s * s[:, nxt]
    ok = (prod > 0) & (n > 1)
    cos = torch.where(ok, k[:, idx, nxt] / prod.clamp_min(1e-300).sqrt(), 0.0)
    columns = torch.stack(
        [
            mean_sq,
            s.mean(dim=1),
            s.sum(dim=1),
            s.max(dim=1).values,
            s.sqrt().sum(dim=1),
            cos.sum(dim=1),
            ok.sum(dim=1).to(torch.float64),
            along,
        ],
        dim=1,
    ).tolist()
    out = []
    for m2, sq_mean, total, s_max, norm_sum, cos_sum, pairs, dir_var in columns:
        out.append(
            GradientMoments(
                n=n,
                mean_norm=m2**0.5,
                mean_sq_norm=sq_mean,
                diversity=_ratio(sq_mean, m2),
                max_share=_ratio(s_max, total),
                participation=_ratio(norm_sum**2, total),
                cos_cyclic_mean=_ratio(cos_sum, pairs),
                noise_scale=_ratio(max(sq_mean - m2, 0.0), m2),
                cov_along_mean=_ratio(dir_var, m2 * m2),
            )
        )
    return out


def moments_from_gram(k: torch.Tensor) -> GradientMoments:
    """Moments of one layer from its ``(N, N)`` Gram matrix; see :func:`moments_from_grams`."""
    return moments_from_grams(k)[0]


def gradient_moments(
    a: torch.Tensor, delta: torch.Tensor, *, include_bias: bool = False
) -> GradientMoments:
    """Per-example gradient moments of one affine layer from its inputs and backprop signals.

    ``a``: layer inputs ``(N, d_in)``; ``delta``: ``dL_i/dz_i`` of the unaveraged per-example
    loss ``(N, d_out)``. See :func:`moments_from_gram` for the formulas.
    """
    return moments_from_gram(gradient_gram(a, delta, include_bias=include_bias))


def norm_quantiles(k: torch.Tensor) -> list[list[float]]:
    """Per layer of ``k`` (``[L, N, N]`` Grams): the :data:`NORM_QUANTILES` of the
    per-example norms ``||g_i|| = sqrt(K_ii)`` and their max, ``L`` lists of floats.

    Linear interpolation between order statistics (``torch.quantile``'s default): with sorted
    ``x_(0) <= ... <= x_(N-1)`` and ``p = q (N - 1)``,
    ``Q(q) = x_(floor p) + (p - floor p) (x_(ceil p) - x_(floor p))``.
    """
    k = k.to("cpu", torch.float64)  # note: one host read for all layers
    # the norms by torch's sqrt (numpy's differs from it in the last bit), then numpy:
    # sorting and the interpolation's elementwise IEEE float64 operations give the bits of
    # the tensor formula, several small tensor operations cheaper
    diag = torch.diagonal(k, dim1=1, dim2=2).clamp_min(0.0).sqrt()
    norms = np.sort(diag.numpy(force=True), axis=1)
    pos = np.array(NORM_QUANTILES, dtype=np.float64) * (norms.shape[1] - 1)
    lo, hi = np.floor(pos).astype(np.int64), np.ceil(pos).astype(np.int64)
    q = norms[:, lo] + (pos - lo.astype(np.float64)) * (norms[:, hi] - norms[:, lo])
    return np.concatenate([q, norms[:, -1:]], axis=1).tolist()
