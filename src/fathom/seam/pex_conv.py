"""Per-example gradients of ``nn.Conv1d/2d`` layers (zero padding, ``groups=1``): see :mod:`fathom.seam.pex`.

With ``u_it`` example ``i``'s input patch at output position ``t`` (``F.unfold``,
channel-major like ``W.reshape(C_out, -1)``; a Conv1d is a ``1 x k`` Conv2d) and ``delta_it``
its output cotangent, ``g_i(W) = sum_t delta_it u_it^T`` over the positions and the ``k``
rows of each example, ``g_i(b) = sum_t delta_it``. One direction: the weight gradient of one
grouped convolution whose groups are the examples (no unfolded copy), one chunk of examples at
a time, or where ``C_in * kernel size`` is small the patches (a strided view of the padded
input) and one batched matmul; ``D`` directions: the patches unfolded once and one batched
matmul with the directions stacked as rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fathom.errors import FathomError
from fathom.seam.types import Call, Layer

UNFOLD_ELEMENTS = 2**24  # per chunk of examples: unfolded patches + stacked cotangents
# One direction: patches and one batched matmul (in place of the grouped convolution) where
# an example's patch has at most this many entries (``C_in * kernel size``: a stem reading
# a few image channels, where the grouped kernel is slow), in chunks of this many elements.
PATCH_COLUMNS = 32
PATCH_ELEMENTS = 2**18
# One direction, grouped convolution: chunks of examples of at most this many input and
# cotangent elements (the kernel's reordered copies of them stay small and in cache)
GROUPED_ELEMENTS = 2**19


def conv_form(layer: Layer, call: Call, cot: list, n: int, directions: bool):
    """Unfolded patches ``[N, T, C_in*k]`` and cotangents ``[(D,) N, T, C_out]`` of a conv call."""
    x, d_cot, m = call.input_leaves()[0].detach(), cot[0], layer.module
    lead = 1 if directions else 0
    if call.in_dims[0] is None or call.in_dims[0][0] != 0 or call.out_dims[0][0] != 0:
        raise FathomError(f"layer {layer.name!r}: a convolution needs the example dimension first")
    if layer.kind == "conv1d":
        x, d_cot = x.unsqueeze(2), d_cot.unsqueeze(2 + lead)
    ks, st, pad, dil = _conv_geometry(m, layer.kind == "conv1d")
    k = call.in_dims[0][1]
    u = F.unfold(x, ks, dilation=dil, padding=pad, stride=st)  # [N*k, C_in*kh*kw, P]
    a = u.unflatten(0, (n, k)).transpose(2, 3).reshape(n, -1, u.shape[1])
    g = d_cot.flatten(2 + lead).unflatten(lead, (n, k)).transpose(-1, -2)
    return a, g.reshape(*g.shape[:lead], n, -1, g.shape[-1])


def _conv_weight_grads(m, x: torch.Tensor, g: torch.Tensor, n: int) -> torch.Tensor:
    """Per-example ``dW`` of a convolution: the weight gradient of one grouped convolution
    whose groups are the examples (input ``[k, N*C_in, ...]``, output ``[k, N*C_out, ...]``,
    ``groups = N * m.groups``), summed over the ``k`` rows of each example by the batch axis."""
    w = m.weight
    wide = w.detach().repeat(n, *([1] * (w.dim() - 1)))
    spatial = w.dim() - 2
    grads = torch.ops.aten.convolution_backward(
        g,
        x,
        wide,
        None,
        list(m.stride),
        list(m.padding),
        list(m.dilation),
        False,
        [0] * spatial,
        n * m.groups,
        [False, True, False],
    )[1]
    return grads.view(n, *w.shape)


def _conv_weight_grads_chunked(m, x: torch.Tensor, g: torch.Tensor, n: int, k: int):
    """Per-example ``dW`` ``[N, *W.shape]`` by :func:`_conv_weight_grads`, one chunk of
    examples (:data:`GROUPED_ELEMENTS`) at a time (each example's gradient is its own group:
    chunking changes no bit); ``x`` ``[N*k, C_in, ...]``, ``g`` ``[N*k, C_out, ...]``."""
    xs, gs = x.unflatten(0, (n, k)), g.unflatten(0, (n, k))
    per = max(1, GROUPED_ELEMENTS // max(1, xs[0].numel() + gs[0].numel()))

    def one(s: int, b: int) -> torch.Tensor:
        fold = xs[s : s + b].transpose(0, 1).reshape(k, -1, *x.shape[2:])
        gk = gs[s : s + b].transpose(0, 1).reshape(k, -1, *g.shape[2:])
        return _conv_weight_grads(m, fold, gk, b)

    if per >= n:
        return one(0, n)
    out = torch.empty(n, *m.weight.shape, dtype=g.dtype, device=g.device)
    for s in range(0, n, per):
        out[s : s + per] = one(s, min(per, n - s))
    return out


def _conv_weight_grads_patches(m, x: torch.Tensor, g: torch.Tensor, n: int, conv1d: bool):
    """Per-example ``dW`` ``[N, *W.shape]`` of a convolution with one row per example, by
    patches: ``g_i = Delta_i U_i^T`` with ``U_i [C_in*kk, P]`` example ``i``'s patches (a
    strided view of the zero-padded input, channel-major like ``W.reshape(C_out, -1)``,
    copied one chunk of examples at a time) and ``Delta_i [C_out, P]`` its cotangent: one
    ``bmm`` per chunk. Cheaper than the grouped convolution where ``C_in * kk`` is small."""
    if conv1d:
        x, g = x.unsqueeze(2), g.unsqueeze(2)
    ks, st, pad, dil = _conv_geometry(m, conv1d)
    if any(pad):
        x = F.pad(x, (pad[1], pad[1], pad[0], pad[0]))
    c_out, ho, wo = g.shape[1], g.shape[-2], g.shape[-1]
    sn, sc, sh, sw = x.stride()
    cols = x.shape[1] * ks[0] * ks[1]
    rows = g.reshape(n, c_out, ho * wo)
    out = torch.empty(n, c_out, cols, dtype=g.dtype, device=g.device)
    per = max(1, PATCH_ELEMENTS // max(1, cols * ho * wo))
    for s in range(0, n, per):
        b = min(per, n - s)
        u = x.as_strided(
            (b, x.shape[1], ks[0], ks[1], ho, wo),
            (sn, sc, dil[0] * sh, dil[1] * sw, st[0] * sh, st[1] * sw),
            x.storage_offset() + s * sn,
        ).reshape(b, cols, ho * wo)
        torch.bmm(rows[s : s + b], u.transpose(1, 2), out=out[s : s + b])
    return out.view(n, *m.weight.shape)


def _conv_geometry(m, conv1d: bool):
    """``(kernel, stride, padding, dilation)`` as 2-D tuples (a Conv1d is a 1 x k Conv2d)."""
    if conv1d:
        return (1, *m.kernel_size), (1, *m.stride), (0, *m.padding), (1, *m.dilation)
    return m.kernel_size, m.stride, m.padding, m.dilation


def _conv_weight_grads_unfolded(layer: Layer, x, d_cot, n: int, k: int) -> torch.Tensor:
    """Per-example, per-direction ``dW`` ``[D, N, *W.shape]`` (a view of ``[N, D, ...]``).

    ``g_id = Delta_id U_i^T`` with ``U_i [C_in*kk, k*P]`` example ``i``'s unfolded patches
    (``F.unfold``, channel-major like ``W.reshape(C_out, -1)``) and ``Delta_id [C_out, k*P]``
    its cotangent rows: the ``D`` directions are stacked as rows, so each example is one
    ``[D*C_out, k*P] @ [k*P, C_in*kk]`` product (one ``bmm`` per chunk of examples, the
    patches unfolded once for every direction)."""
    m, conv1d = layer.module, layer.kind == "conv1d"
    if conv1d:
        x, d_cot = x.unsqueeze(2), d_cot.unsqueeze(3)
    ks, st, pad, dil = _conv_geometry(m, conv1d)
    dirs, c_out = d_cot.shape[0], d_cot.shape[2]
    positions = int(d_cot[0, 0, 0].numel())
    cols = x.shape[1] * ks[0] * ks[1]
    out = torch.empty(n, dirs * c_out, cols, dtype=d_cot.dtype, device=d_cot.device)
    per = max(1, UNFOLD_ELEMENTS // max(1, k * positions * (cols + dirs * c_out)))
    for s in range(0, n, per):
        b = min(per, n - s)
        u = F.unfold(x[s * k : (s + b) * k], ks, dilation=dil, padding=pad, stride=st)
        u = u.unflatten(0, (b, k)).transpose(1, 2).reshape(b, cols, k * positions)
        g = d_cot[:, s * k : (s + b) * k].reshape(dirs, b, k, c_out, positions)
        g = g.permute(1, 0, 3, 2, 4).reshape(b, dirs * c_out, k * positions)
        torch.bmm(g, u.transpose(1, 2), out=out[s : s + b])
    return out.view(n, dirs, *m.weight.shape).transpose(0, 1)


def conv_grads(layer, call, cot, n, directions) -> dict[str, torch.Tensor]:
    """Convolution: ``g_i(W) = sum_t delta_it u_it^T`` over output positions ``t`` and the
    ``k`` rows of example ``i``: for several directions by unfolded patches and one batched
    matmul (:func:`_conv_weight_grads_unfolded`), for one as a grouped-convolution weight
    gradient (:func:`_conv_weight_grads`, no unfolded copy), or where an example's patch
    is small (:data:`PATCH_COLUMNS`) by patches (:func:`_conv_weight_grads_patches`)."""
    where = f"layer {layer.name!r}"
    x, d_cot = call.input_leaves()[0].detach(), cot[0]
    if call.in_dims[0] is None or call.in_dims[0][0] != 0 or call.out_dims[0][0] != 0:
        raise FathomError(f"{where}: a convolution needs the example dimension first")
    k = call.in_dims[0][1]
    slices = d_cot if directions else d_cot.unsqueeze(0)
    out: dict[str, torch.Tensor] = {}
    small = x.shape[1] * layer.module.weight[0, 0].numel() <= PATCH_COLUMNS
    if slices.shape[0] > 1:
        out["weight"] = _conv_weight_grads_unfolded(layer, x, slices, n, k)
    elif k == 1 and small and slices.dtype == x.dtype:
        conv1d = layer.kind == "conv1d"
        g = _conv_weight_grads_patches(layer.module, x, slices[0], n, conv1d)
        out["weight"] = g.unsqueeze(0)
    else:
        out["weight"] = _conv_weight_grads_chunked(layer.module, x, slices[0], n, k).unsqueeze(0)
    if "bias" in layer.params:
        g = slices.unflatten(1, (n, k))  # [D, N, k, C_out, ...]
        out["bias"] = g.sum(dim=(2, *range(4, g.dim())))
    return out if directions else {p: v[0] for p, v in out.items()}
