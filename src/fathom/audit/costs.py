"""Measured cost of each reduced network: FLOPs counted by torch, never hand formulas.

For mask ``m`` the model runs once on ``x`` in dense evaluation mode with the removed
branches not computed (:func:`fathom.depth.branch_mask`), under
:class:`torch.utils.flop_counter.FlopCounterMode`::

    flops_m = sum over the ops torch counts (mm, addmm, bmm, convolution, attention, ...)
    macs_m  = flops_m / (2 * batch)          (one multiply-accumulate = 2 FLOPs; per example)

torch counts matrix products and convolutions (``2 * m * n * k`` for an ``[m, k] @ [k, n]``
product; an ``addmm`` bias is not counted); elementwise work (activations, BatchNorm in eval,
pooling, the crop bypass, softmax) is not counted. A spiking net's timesteps fold into the
batch and are counted. The matrix kernels torch's counter has no formula for are counted
here by the same rule (:data:`_MATRIX_FORMULAS`, one multiply-accumulate = 2 FLOPs, an added
term not counted)::

    mv / addmv      [m, k] @ [k]                 2 m k
    dot / vdot      [k] . [k]                    2 k
    addbmm          sum_b [b, n, k] @ [b, k, m]  2 b n k m     (the sum over b not counted)
    addr            u [m] v[n]^T                 2 m n
    cdist           [B, P, M] to [B, R, M]       2 B P R M     (one per pair and feature, as
                                                                the product x1 x2^T; p any)
    pdist           [N, M]                       2 (N (N - 1) / 2) M   (the same, per pair)
    conv_tbc        [T, B, C_in], [K, C_in, C_out]  2 T_out B C_out C_in K

**What runs is what the trainer runs.** A no-grad evaluation forward may take fused kernels
that training never takes and torch's counter does not see (``nn.MultiheadAttention`` /
``nn.TransformerEncoderLayer``'s inference fast path; oneDNN and cuDNN recurrent kernels), so
the counting forward runs with the MHA fast path, oneDNN and cuDNN switched off
(:func:`_counted_kernels`, restored after): attention then runs its input projection, scaled
dot-product attention (``2 * b * h * s_q * s_k * (d_qk + d_v)`` FLOPs: ``QK^T`` and
``softmax(.) V``; a causal mask is counted in full, as torch does), output projection and
feed-forward as separate counted products, and RNN/GRU/LSTM their per-step gate products.
The SDPA kernels torch has no formula for (the CPU flash kernel, ...) get torch's own
``sdpa_flop_count``. A kernel that does matrix work and is still not counted is refused, naming
the kernel and the module that called it (:data:`_UNCOUNTED_KERNELS`): never a silent zero.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count
from torch.utils.module_tracker import ModuleTracker

from fathom.audit.masks import enumerate_masks, removable_branch_count
from fathom.depth import branch_mask, dense_eval, state_kept
from fathom.errors import FathomError
from fathom.seam.discovery import check_compiled


def check_masks(model: nn.Module, masks: np.ndarray | None) -> np.ndarray:
    """``masks`` as ``uint8 [M, k]`` for the ``k`` branches of ``model`` (all ``2^k`` if None)."""
    k = removable_branch_count(model)
    if masks is None:
        return enumerate_masks(k)
    masks = np.asarray(masks)
    if masks.ndim != 2 or masks.shape[1] != k or masks.shape[0] == 0:
        raise FathomError(
            f"masks of shape {list(masks.shape)} do not fit {type(model).__name__}, which has "
            f"{k} SkippableResidual branches; pass an array [masks, {k}] of 0/1 (or None for all)"
        )
    if not np.isin(masks, (0, 1)).all():
        raise FathomError("mask entries must be 0 (branch removed) or 1 (kept)")
    return masks.astype(np.uint8)


# Scaled dot-product attention kernels without a formula in torch's counter (it has the CUDA
# flash / efficient / cuDNN ones): counted with torch's own sdpa_flop (QK^T and softmax . V).
_SDPA_WITHOUT_FORMULA = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable",
    "_scaled_dot_product_attention_math_for_mps",
)

# Kernels doing matrix work that neither torch's counter nor :data:`_MATRIX_FORMULAS` counts:
# :func:`_counted_kernels` routes around the fused ones, and one that still runs is refused,
# naming it and its module, rather than counted as 0.
_UNCOUNTED_KERNELS = frozenset(
    {
        "_native_multi_head_attention",
        "_transformer_encoder_layer_fwd",
        "mkldnn_rnn_layer",
        "mkldnn_rnn",
        "_cudnn_rnn",
        "miopen_rnn",
        "_thnn_fused_lstm_cell",
        "_thnn_fused_gru_cell",
        "_trilinear",
        "mkldnn_linear",
        # linear algebra, transforms, quantized and sparse products: no formula here
        "_linalg_solve_ex",
        "linalg_solve_triangular",
        "triangular_solve",
        "cholesky_solve",
        "linalg_lu_solve",
        "linalg_lu_factor_ex",
        "linalg_lu",
        "_linalg_svd",
        "_linalg_eigh",
        "linalg_eig",
        "_linalg_eigvals",
        "linalg_qr",
        "geqrf",
        "ormqr",
        "linalg_householder_product",
        "linalg_cholesky_ex",
        "linalg_inv_ex",
        "_linalg_det",
        "_linalg_slogdet",
        "cholesky_inverse",
        "linalg_matrix_exp",
        "linalg_lstsq",
        "linalg_pinv",  # one kernel around an SVD or eigendecomposition
        "linalg_ldl_factor_ex",
        "linalg_ldl_solve",
        "_fft_r2c",
        "_fft_c2r",
        "_fft_c2c",
        "_int_mm",
        "_weight_int8pack_mm",
        "_weight_int4pack_mm",
        "_grouped_mm",
        "_mixed_dtypes_linear",
        "_sparse_addmm",
        "_sparse_mm",
        "sspaddmm",
        "_sparse_sparse_matmul",
    }
)


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _mv_flops(a_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * _prod(a_shape)  # [m, k] @ [k]: 2 m k


def _addmv_flops(self_shape, a_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * _prod(a_shape)


def _dot_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * _prod(a_shape)


def _addbmm_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    (b, n, k), m = a_shape, b_shape[-1]
    return 2 * b * n * k * m


def _addr_flops(self_shape, u_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * _prod(u_shape) * _prod(v_shape)


def _cdist_flops(x1_shape, x2_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * _prod(out_shape) * int(x1_shape[-1])  # [.., P, R] pairs x M features


def _pdist_flops(x_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * _prod(out_shape) * int(x_shape[-1])  # N (N - 1) / 2 pairs x M features


def _conv_tbc_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    k, c_in, _ = w_shape
    return 2 * _prod(out_shape) * c_in * k  # [T_out, B, C_out] outputs x C_in K products


def _addmm_activation_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs):
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


# Matrix kernels without a formula in torch's counter, counted by the module docstring's rule.
_MATRIX_FORMULAS = {
    "mv": _mv_flops,
    "addmv": _addmv_flops,
    "dot": _dot_flops,
    "vdot": _dot_flops,
    "addbmm": _addbmm_flops,
    "addr": _addr_flops,
    "_cdist_forward": _cdist_flops,
    "_euclidean_dist": _cdist_flops,
    "_pdist_forward": _pdist_flops,
    "conv_tbc": _conv_tbc_flops,
    "_addmm_activation": _addmm_activation_flops,
}


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's ``sdpa_flop_count``: ``2 b h s_q s_k d_qk + 2 b h s_q s_k d_v`` (shapes b h s d)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _custom_mapping() -> dict:
    """The SDPA kernels without a formula and :data:`_MATRIX_FORMULAS`, by aten op."""
    named = {name: _sdpa_flops for name in _SDPA_WITHOUT_FORMULA} | _MATRIX_FORMULAS
    ops = ((getattr(torch.ops.aten, name, None), f) for name, f in named.items())
    return {op: f for op, f in ops if op is not None}


@contextmanager
def _counted_kernels() -> Iterator[None]:
    """Run the kernels training runs: no MHA inference fast path, no oneDNN / cuDNN (restored).

    These switches change which kernel computes a product, never the products computed.
    """
    saved = (
        torch.backends.mha.get_fastpath_enabled(),
        torch.backends.mkldnn.enabled,
        torch.backends.cudnn.enabled,
    )
    try:
        torch.backends.mha.set_fastpath_enabled(False)
        torch.backends.mkldnn.enabled = False
        torch.backends.cudnn.enabled = False
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(saved[0])
        torch.backends.mkldnn.enabled = saved[1]
        torch.backends.cudnn.enabled = saved[2]


class _UncountedKernels(TorchDispatchMode):
    """Records each :data:`_UNCOUNTED_KERNELS` op that runs, with the innermost module calling it."""

    def __init__(self, tracker: ModuleTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.seen: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _UNCOUNTED_KERNELS:
            inner = max(self.tracker.parents, key=lambda n: (n.count("."), len(n)), default="")
            self.seen.append((name, inner))
        return func(*args, **(kwargs or {}))


def _count_forward(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one ``model(x)`` as torch counts them, or a FathomError naming an uncounted kernel."""
    counter = FlopCounterMode(display=False, custom_mapping=_custom_mapping())
    tracker = ModuleTracker()
    uncounted = _UncountedKernels(tracker)
    with counter, tracker, uncounted:
        model(x)
    if uncounted.seen:
        kernel, module = uncounted.seen[0]
        raise FathomError(
            f"mask_costs cannot count the FLOPs of {module or type(model).__name__}: it runs "
            f"the kernel aten.{kernel}, matrix work that neither torch's FLOP counter nor "
            "fathom counts (it "
            "would be reported as 0 MACs); express the module with nn.Linear / matmul / "
            "convolution / scaled_dot_product_attention, or audit without mask costs"
        )
    return int(counter.get_total_flops())


@torch.no_grad()
def mask_costs(model: nn.Module, x: torch.Tensor, masks: np.ndarray | None = None) -> np.ndarray:
    """FLOPs (``int64 [M]``) of one forward of the batch ``x`` under each mask.

    ``masks`` defaults to every mask (:func:`fathom.audit.masks.enumerate_masks` order);
    pass ``x[:1]`` for the cost of one example. See the module docstring for what is counted
    (the kernels the trainer runs, attention and recurrent layers included). Every module's
    mode, the masks, buffers and parameters are left as found; a compiled model
    (``torch.compile``) is refused: pass ``model._orig_mod``.
    """
    check_compiled(model, "mask_costs' FLOP counter")
    masks = check_masks(model, masks)
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] == 0:
        raise FathomError("mask_costs needs a batch x of at least one example (e.g. x[:1])")
    out = np.zeros(masks.shape[0], dtype=np.int64)
    with dense_eval(model), state_kept(model, parameters=True), _counted_kernels():
        for m, row in enumerate(masks):
            with branch_mask(model, tuple(int(b) for b in row)):
                out[m] = _count_forward(model, x)
    return out


def mask_macs(model: nn.Module, masks: np.ndarray, x: torch.Tensor) -> list[int]:
    """Multiply-accumulates per example of each reduced network: ``flops_m / (2 * batch)``."""
    flops = mask_costs(model, x[:1], masks)
    return [int(f) // 2 for f in flops]
