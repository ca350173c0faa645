"""Exact float64 curvature diagonals of any model returning logits, and gradient concentration.

Normalization: every matrix is a **mean over the N probe examples** (the curvature of the
mean CE over the probe; CE per example unaveraged). With ``J_i`` example ``i``'s logit
Jacobian in the parameters and ``v_ik`` a set of output directions, the matrix
``M = (1/N) sum_i sum_k (J_i^T v_ik)(J_i^T v_ik)^T`` has the diagonal

    diag(M) = (1/N) sum_i sum_k (J_i^T v_ik)^2        (elementwise square, every parameter)

and the three matrices differ only in their output directions:

* CE **GGN** ``(1/N) sum_i J_i^T H_i J_i``: ``v_ik = s_ik``, the ``C`` columns of the square-root
  factor of the softmax Hessian ``H_i = diag(p_i) - p_i p_i^T`` (exact, not sampled);
* **empirical Fisher** ``(1/N) sum_i g_i g_i^T`` (observed labels): one direction ``r_i = p_i - e_y``;
* **logit-Jacobian Gram** ``(1/N) sum_i J_i^T J_i``: ``v_ic = e_c``, the ``C`` unit logits.

How (the curvlinops way, step by step): one forward of the float64 copy under the seam's
hooks; one batched backward of the ``C`` unit directions to every layer output (the
Jacobian rows ``J_i^T e_c``, :func:`fathom.curvature.probe.pull_back`); then per layer

* ``nn.Linear`` with one row per example (``a_i [d_in]``, ``u_ic = J_{z,i}^T e_c``): mix the
  rows into GGN and Fisher directions by linearity (``J^T s_ik = sum_c S_i[c, k] u_ic``,
  ``J^T r_i = sum_c r_ic u_ic``), then ``diag_W = (1/N) sum_i (sum_k u_iko^2) a_ij^2`` is one
  matmul; per-example gradients are never formed;
* every other layer (Linear over positions, Conv1d/2d, and by the generic ``torch.func``
  path BatchNorm, LayerNorm, Embedding, attention, custom modules): the per-example
  Jacobian rows ``J_i^T e_c`` of its parameters (:func:`fathom.pex.per_example_grads`),
  mixed the same way and squared, in chunks of examples that bound memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fathom.curvature.probe import (
    float64_copy,
    probe_inputs,
    probe_labels,
    pull_back,
)
from fathom.curvature.softmax import label_residual, softmax_hessian_sqrt, softmax_parts
from fathom.pex import linear_rows, per_example_grads
from fathom.seam import Call, Layer, Seam, discover

KINDS: tuple[str, ...] = ("ggn", "fisher", "jacobian")
_ELEMENTS = 2**25  # per chunk: directions x examples x parameters of the largest materialized layer


@dataclass(frozen=True)
class OutputDirections:
    """Per-example output directions: ``S [N, C, K]`` (GGN) and ``r [N, C]`` (Fisher)."""

    sqrt_hessian: torch.Tensor
    residual: torch.Tensor

    @staticmethod
    def of(logits: torch.Tensor, labels: torch.Tensor) -> OutputDirections:
        parts = softmax_parts(logits)
        return OutputDirections(softmax_hessian_sqrt(parts), label_residual(parts, labels))


Sums = dict[str, torch.Tensor]  # kind -> unnormalized sum over examples, one parameter


def single_row(layer: Layer, calls: list[Call]) -> bool:
    """A linear layer called once on ``[N, d_in]``: the factorized (never materialized) path."""
    return (
        layer.kind == "linear"
        and len(calls) == 1
        and calls[0].input_leaves()[0].dim() == 2
        and calls[0].in_dims[0] == (0, 1)
    )


def _linear_sums(layer, calls, cots, n: int, dirs: OutputDirections) -> dict[str, Sums]:
    a, u = linear_rows(layer, calls, cots, n, directions=True)
    a, u = a[:, 0], u[:, :, 0]  # [N, d_in], [C, N, d_out]
    d_out = u.shape[-1]
    ggn = torch.einsum("ick,cio->kio", dirs.sqrt_hessian, u)
    fisher = torch.einsum("ic,cio->io", dirs.residual, u)
    sq = torch.cat([ggn.square().sum(0), fisher.square(), u.square().sum(0)], dim=1)
    w = (sq.T @ a.square()).split(d_out)
    out = {"weight": dict(zip(KINDS, w, strict=True))}
    if "bias" in layer.params:
        out["bias"] = dict(zip(KINDS, sq.sum(0).split(d_out), strict=True))
    return out


def _materialized_sums(layer, calls, cots, n: int, dirs: OutputDirections) -> dict[str, Sums]:
    grads = per_example_grads(layer, calls, cots, n, directions=True)
    out = {}
    for name, j in grads.items():
        shape = j.shape[2:]
        jf = j.reshape(j.shape[0], n, -1)  # [C, N, numel]: rows J_i^T e_c
        ggn = torch.einsum("ick,cim->kim", dirs.sqrt_hessian, jf)
        fisher = torch.einsum("ic,cim->im", dirs.residual, jf)
        out[name] = {
            "ggn": ggn.square().sum((0, 1)).reshape(shape),
            "fisher": fisher.square().sum(0).reshape(shape),
            "jacobian": jf.square().sum((0, 1)).reshape(shape),
        }
    return out


def layer_sums(layer, calls, cots, n: int, dirs: OutputDirections) -> dict[str, Sums]:
    """``{local param: {kind: sum_i sum_k (J_i^T v_ik)^2}}`` for one layer (not yet / N)."""
    if single_row(layer, calls):
        return _linear_sums(layer, calls, cots, n, dirs)
    return _materialized_sums(layer, calls, cots, n, dirs)


def _layout(seam: Seam, x: torch.Tensor) -> tuple[int, int]:
    """``(classes, examples per chunk)``: the largest materialized layer stays in budget."""
    with seam.capture() as calls, torch.no_grad():
        classes = int(seam.model(x[:1]).shape[1])
    largest = max(
        (
            sum(t.numel() for t in layer.tensors().values())
            for layer in seam.layers
            if not single_row(layer, calls[layer.name])
        ),
        default=0,
    )
    return classes, max(1, _ELEMENTS // max(1, 3 * classes * largest))


def exact_diagonals(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, chunk_size: int | None = None
) -> dict[str, dict[str, torch.Tensor]]:
    """Exact float64 ``{"ggn"|"fisher"|"jacobian": {param_name: diagonal}}`` on ``(x, y)``.

    Diagonals of ``(1/N) sum_i J_i^T H_i J_i`` (CE GGN), ``(1/N) sum_i g_i g_i^T`` (empirical
    Fisher at the labels ``y``) and ``(1/N) sum_i J_i^T J_i`` (logit-Jacobian Gram), see the
    module docstring; keyed by every name of ``model.named_parameters()``, shaped like the
    parameter. ``model`` is any ``nn.Module`` returning logits ``[N, C]``; it is left
    untouched (a float64 copy in dense evaluation mode is used). A module the seam cannot
    cover is refused, naming it.
    """
    model64 = float64_copy(model)
    x = probe_inputs(model64, x)
    n = x.shape[0]
    seam = discover(model64, x)
    classes, auto_chunk = _layout(seam, x)
    labels = probe_labels(y.to(x.device) if isinstance(y, torch.Tensor) else y, n, classes)
    chunk = chunk_size or auto_chunk
    names = [name for name, _ in model64.named_parameters()]
    params = dict(model64.named_parameters())
    total = {k: {p: torch.zeros_like(params[p]).detach() for p in names} for k in KINDS}
    for start in range(0, n, chunk):
        xc, yc = x[start : start + chunk], labels[start : start + chunk]
        pb = pull_back(seam, xc)
        dirs = OutputDirections.of(pb.logits, yc)
        for layer in seam.layers:
            sums = layer_sums(layer, pb.calls[layer.name], pb.cotangents[layer.name], len(xc), dirs)
            for local, qualified in zip(layer.params, layer.qualified, strict=True):
                for kind in KINDS:
                    total[kind][qualified] += sums[local][kind]
    return {k: {p: v / n for p, v in total[k].items()} for k in KINDS}


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
