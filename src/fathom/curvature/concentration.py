"""Concentration of per-example gradients, from their Gram (the curvature job's names)."""

from __future__ import annotations

import torch

from fathom.telemetry.moments import moments_from_gram


def gradient_concentration(gram: torch.Tensor) -> dict[str, float | None]:
    """Concentration of per-example gradients ``g_i`` from their Gram ``K_ij = <g_i, g_j>``.

    The curvature job's names for quantities defined once in
    :func:`fathom.telemetry.moments.moments_from_gram` (``N`` examples, ``gbar = (1/N) sum_i g_i``):

    * ``mean_gradient_sq_norm = ||gbar||^2 = 1^T K 1 / N^2`` (telemetry's ``mean_norm``, squared);
    * ``covariance_trace = (1/N) sum_i ||g_i - gbar||^2 = tr(K)/N - ||gbar||^2`` (population, 1/N);
    * ``covariance_to_mean_ratio = covariance_trace / ||gbar||^2`` (telemetry's ``noise_scale``:
      N-1 when one example carries all the gradient; ``None`` when ``gbar = 0``);
    * ``norm_participation = (sum_i ||g_i||)^2 / sum_i ||g_i||^2`` in ``[1, N]`` (telemetry's
      ``participation``; ``None`` if all zero).
    """
    m = moments_from_gram(gram)
    mean_sq = m.mean_norm**2
    return {
        "mean_gradient_sq_norm": mean_sq,
        "covariance_trace": max(m.mean_sq_norm - mean_sq, 0.0),
        "covariance_to_mean_ratio": m.noise_scale,
        "norm_participation": m.participation,
    }
