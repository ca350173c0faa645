"""Depth-wise Lyapunov exponents: how a perturbation grows or shrinks from block to block.

The network is a chain of blocks ``h_{l+1} = f_l(h_l)``, ``l = 1..L`` (the classifier is not
a block). Tangent vectors are pushed through the chain with Jacobian-vector products
(forward-mode AD: ``v -> J_l v`` with ``J_l = ∂f_l/∂h_l`` at ``h_l``), renormalized after
every block. For spiking blocks the Jacobian is the surrogate Jacobian (the derivative the
surrogate gradient defines); BatchNorm must be in eval mode (see :func:`eval_mode`) so
samples do not interact.

Maximal exponent, per sample (RMS over every non-batch coordinate, so a block that
changes shape, e.g. a pooling or a width change, is not credited with the change of
dimension)::

    rms(v) = ||v||_2 / sqrt(numel(v))
    g_l = rms(J_l v_l) / rms(v_l),    v_{l+1} = J_l v_l / rms(J_l v_l)      (rms(v_1) = 1)
    λ̂ = (1/L) Σ_l log g_l

k exponents (QR / Benettin): ``k`` tangents ``V_l = sqrt(D_l) Q_l`` (orthonormal ``Q_l``,
``D_l`` coordinates, so every column has unit RMS); ``J_l V_l = Q_{l+1} R_l`` (reduced QR)::

    log g_{l,i} = log |R_l[i, i]| - (1/2) log D_{l+1},      λ̂_i = (1/L) Σ_l log g_{l,i}

For ``k = 1`` this is the maximal exponent. For a chain of maps ``h -> s_l O_l h`` with
orthogonal ``O_l`` every exponent equals ``(1/L) Σ_l log s_l``.

A zero gain (a dead block) would give ``log 0``; gains are floored at the dtype's
smallest normal number, so λ̂ stays finite (about -87 per block in float32) and the
per-block gains show where the signal died.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.autograd.forward_ad as fwad
from torch import nn

from fathom.errors import FathomError

Block = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LyapunovEstimate:
    """``exponents[b, i]`` (λ̂_i of sample b) and ``log_gains[b, l, i]`` (block l)."""

    exponents: torch.Tensor
    log_gains: torch.Tensor

    @property
    def maximal(self) -> torch.Tensor:
        """λ̂ per sample (first exponent), shape ``[B]``."""
        return self.exponents[:, 0]


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode (BatchNorm uses, and does not update, running stats)."""
    was = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in was:
            m.training = training


def rms(v: torch.Tensor) -> torch.Tensor:
    """Per-sample root-mean-square over every non-batch coordinate, shape ``[B]``."""
    return v.flatten(1).square().mean(1).sqrt()


def jvp(block: Block, h: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(f(h), J_f(h) v)`` by forward-mode AD; differentiable w.r.t. parameters (reverse mode)."""
    with fwad.dual_level():
        out = block(fwad.make_dual(h, v))
        primal, tangent = fwad.unpack_dual(out)
    if tangent is None:
        raise FathomError(
            "a block's output does not depend on its input (no tangent came through); "
            "Lyapunov exponents need blocks that are functions of their input"
        )
    return primal, tangent


def random_tangents(
    x: torch.Tensor, k: int = 1, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``k`` standard-normal tangents per sample, ``[B, k, *x.shape[1:]]``, from ``generator``."""
    shape = (x.shape[0], k, *x.shape[1:])
    return torch.randn(shape, generator=generator, dtype=x.dtype, device="cpu").to(x.device)


def lyapunov_exponents(
    blocks: Sequence[Block],
    x: torch.Tensor,
    k: int = 1,
    *,
    tangents: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> LyapunovEstimate:
    """The ``k`` leading depth-wise Lyapunov exponents of ``blocks`` at inputs ``x``.

    ``tangents`` (``[B, k, *x.shape[1:]]``) default to Gaussian draws from ``generator``
    (drawn on the CPU, so the stream does not depend on the device). ``k = 1`` is the
    maximal exponent, computed without QR. Formulas in the module docstring.
    """
    if not blocks:
        raise FathomError("Lyapunov exponents need at least one block")
    if k < 1:
        raise FathomError(f"number of exponents k must be >= 1, got {k}")
    if tangents is None:
        tangents = random_tangents(x, k, generator)
    if tangents.shape != (x.shape[0], k, *x.shape[1:]):
        raise FathomError(
            f"tangents shaped {list(tangents.shape)}; expected {[x.shape[0], k, *x.shape[1:]]}"
        )
    batch = x.shape[0]
    tiny = torch.finfo(x.dtype).tiny
    # the k tangents of a sample ride along the batch: row b * k + i is tangent i of sample b
    h = x.unsqueeze(1).expand(-1, k, *x.shape[1:]).flatten(0, 1)
    v = _orthonormal_unit_rms(tangents.flatten(2)).flatten(0, 1).view_as(h)
    gains = []
    for block in blocks:
        h, jv = jvp(block, h, v)  # apply the block's Jacobian onto v: v -> J_l v
        cols = jv.reshape(batch, k, -1)  # [B, k, D_{l+1}]
        dim = cols.shape[-1]
        if k == 1:
            gain = cols.norm(dim=-1) / math.sqrt(dim)  # rms(J_l v_l), rms(v_l) = 1: [B, 1]
            v = cols / gain.clamp_min(tiny)[..., None]
        else:
            if dim < k:
                raise FathomError(f"a block outputs {dim} coordinates, fewer than k={k} exponents")
            q, r = torch.linalg.qr(cols.transpose(1, 2))  # J_l V_l = Q R: [B, D, k], [B, k, k]
            gain = r.diagonal(dim1=1, dim2=2).abs() / math.sqrt(dim)
            v = q.transpose(1, 2) * math.sqrt(dim)  # unit-RMS orthogonal tangents
        gains.append(gain.clamp_min(tiny).log())
        v = v.reshape_as(h)
    log_gains = torch.stack(gains, dim=1)  # [B, L, k]
    return LyapunovEstimate(exponents=log_gains.mean(1), log_gains=log_gains)


def _orthonormal_unit_rms(t: torch.Tensor) -> torch.Tensor:
    """``[B, k, D]`` -> rows orthonormalized per sample (QR; plain normalization for k = 1),
    each with unit RMS (norm ``sqrt(D)``)."""
    dim = t.shape[-1]
    if t.shape[1] == 1:
        return t / (t.norm(dim=-1, keepdim=True) / math.sqrt(dim))
    q, _ = torch.linalg.qr(t.transpose(1, 2))
    return q.transpose(1, 2) * math.sqrt(dim)


def model_lyapunov(
    model: nn.Module,
    x: torch.Tensor,
    k: int = 1,
    *,
    generator: torch.Generator | None = None,
    tangents: torch.Tensor | None = None,
) -> LyapunovEstimate:
    """:func:`lyapunov_exponents` over ``model.lyapunov_blocks()``, BatchNorm in eval mode.

    Needs a model exposing ``lyapunov_blocks()`` (e.g.
    :class:`fathom.models.convnet.StagedConvNet`). Gradients w.r.t. parameters flow
    (so it serves as a regularizer); running statistics are not touched.
    """
    if not hasattr(model, "lyapunov_blocks"):
        raise FathomError(
            f"{type(model).__name__} has no lyapunov_blocks(); depth-wise Lyapunov exponents "
            "need the model split into blocks (StagedConvNet provides it)"
        )
    with eval_mode(model):
        return lyapunov_exponents(
            model.lyapunov_blocks(), x, k, tangents=tangents, generator=generator
        )
