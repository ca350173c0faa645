"""Curvature of a language model's run: its own loss, the estimator that fits, per block.

A next-token model's output is ``[N, T, V]`` logits and its loss the token-level
cross-entropy, the mean over the ``M`` valid positions (:func:`fathom.models.gpt.token_loss`;
one "example" is one sequence window)::

    L = (1/M) sum_i sum_t m_it l(z_it, y_it),   GGN = (1/M) sum_i sum_t m_it J_it^T H_it J_it,

``H_it = diag(p_it) - p_it p_it^T`` the softmax Hessian at position ``t`` of window ``i`` and
``m_it`` one for a valid position. The exact GGN diagonal pulls back ``T (V - 1)`` directions
per window (:func:`fathom.curvature.exact.exact_diagonals` with that loss); Monte-Carlo
(:func:`fathom.curvature.estimate.loss_diagonals`, the loss's own draws) pulls back ``K``
per window, each drawing one token per position independently::

    v_ik = sqrt(N / M) (m_it (p_it - e_yhat_it))_t,   yhat_it ~ Categorical(p_it),

so ``E[v v^T]`` is block-diagonal over positions (the draws are independent and each
block's mean ``p - E[e_yhat]`` is zero) with blocks ``(N / M) m_it H_it``; the caller's
``1/(N K) sum_i sum_k`` then estimates the GGN above, with the standard error of
:mod:`fathom.curvature.estimate`. Hutchinson applies ``H_it v = p * v - p (p . v)`` per
position (``O(V)``, never a ``[V, V]`` matrix) inside one GGN-vector product per draw.
``estimator="auto"`` chooses exact when its memory and its ``T (V - 1) + 1`` directions
per window fit the budget (:func:`fathom.curvature.estimate.choose`), otherwise MC. The empirical Fisher
(per-window gradients, one direction per window; its formula and normalization are its row
of :data:`fathom.curvature.families.FAMILIES`) is always exact.

Every record says the estimator of each family, the samples, the seed and why
(:meth:`fathom.curvature.estimate.Estimate.record`).
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from fathom.curvature.estimate import Budget, Estimate, loss_diagonals, resolve_estimator
from fathom.curvature.twin import prepared
from fathom.errors import FathomError
from fathom.losses.kinds import CrossEntropy, Loss

_FAMILIES: tuple[str, ...] = ("ggn", "empirical_fisher")
"""The families a language model's snapshot computes (the Jacobian Gram of ``T V`` logits
per window is left out: it is the GGN's cost without its loss)."""


def _check_loss(loss: Loss, y: torch.Tensor) -> int:
    """The number ``M`` of valid positions, after refusing what this path does not cover."""
    if not isinstance(loss, CrossEntropy) or loss.class_dim != -1 or loss.label_smoothing:
        raise FathomError(
            f"a language model's curvature reads token cross-entropy over [N, T, V] (class_dim"
            f"=-1, no label smoothing), got {loss!r}; use fathom.models.gpt.token_loss()"
        )
    if y.dim() != 2 or y.is_floating_point():
        raise FathomError(
            f"a language model's targets are integer tokens [N, T], got {y.dtype} {list(y.shape)}"
        )
    valid = int((y != loss.ignore_index).sum())
    if valid == 0:
        raise FathomError("every target position is ignored; a probe needs a scored position")
    return valid


def token_diagonals(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: Loss,
    estimator: str = "auto",
    samples: int = 8,
    seed: int = 0,
    budget: Budget | None = None,
) -> Estimate:
    """Float64 GGN and empirical-Fisher diagonals of ``loss`` (token cross-entropy, mean
    over valid positions) on windows ``x [N, T]`` with targets ``y [N, T]``; the GGN by
    ``estimator`` (``"exact"``, ``"mc"``, ``"hutchinson"`` or ``"auto"``, module docstring),
    ``K = samples`` draws per window (Hutchinson: per probe) from
    ``torch.Generator().manual_seed(seed)``: :func:`fathom.curvature.estimate.loss_diagonals`
    with this loss."""
    resolve_estimator(estimator)
    _check_loss(loss, y)
    return loss_diagonals(
        model,
        x,
        y,
        loss=loss,
        families=_FAMILIES,
        estimator=estimator,
        samples=samples,
        seed=seed,
        budget=budget,
    )


def block_of(parameter: str) -> str:
    """The block a parameter belongs to: ``blocks.<l>`` for a skippable block's parameters,
    else the parameter's top-level module (``wte``, ``wpe``, ``ln_f``)."""
    parts = parameter.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" and len(parts) > 2 else parts[0]


def token_snapshot(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: Loss,
    estimator: str = "auto",
    samples: int = 8,
    seed: int = 0,
    budget: Budget | None = None,
) -> dict:
    """The JSON record of a language model's curvature on the probe: the estimator record
    (estimator per family, samples, seed, why, traces and standard errors), the probe's
    token cross-entropy and perplexity, and the traces per block (:func:`block_of`; sums
    of the per-parameter traces, weights and biases; the GGN's standard error per
    parameter is in the estimator record, a block's is not formed: its parameters' draws
    are correlated)."""
    t0 = time.perf_counter()
    est = token_diagonals(
        model, x, y, loss=loss, estimator=estimator, samples=samples, seed=seed, budget=budget
    )
    _, x64, seam = prepared(model, x, loss=loss)
    with torch.no_grad():
        logits = seam.forward(x64)
    target = y.to(logits.device).long()
    ce = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        target.reshape(-1),
        ignore_index=loss.ignore_index,
    )
    blocks: dict[str, dict[str, float]] = {}
    for f in _FAMILIES:
        for p, v in est.parameter_traces[f].items():
            row = blocks.setdefault(block_of(p), {})
            row[f"{f}_trace"] = row.get(f"{f}_trace", 0.0) + v
    return {
        "dtype": "float64",
        "mode": "dense evaluation: eval(), every block at gain one",
        "loss": "token cross-entropy, mean over the valid positions (nats per token); one "
        "example = one window; GGN = (1/M) sum_i sum_t m_it J_it^T H_it J_it",
        **est.record(),
        "probe_size": int(logits.shape[0]),
        "positions": int((target != loss.ignore_index).sum()),
        "vocab": int(logits.shape[-1]),
        "probe_ce_mean": float(ce),
        "probe_ppl": math.exp(float(ce)),
        "blocks": [{"block": b, **row} for b, row in blocks.items()],
        "compute_s": time.perf_counter() - t0,
    }
