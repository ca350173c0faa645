"""Per-example gradients of ``nn.MultiheadAttention`` in closed form: see :mod:`fathom.seam.pex`.

The stock module with packed ``in_proj_weight`` (equal q/k/v dims), no ``bias_k``/``bias_v``,
no ``add_zero_attn``, called without masks: with example ``i``'s query, key and value rows
``x^q_it, x^k_is, x^v_is`` (``[L, E]``, ``[S, E]``), ``W_q, W_k, W_v`` the thirds of
``in_proj_weight``, ``H`` heads of width ``d = E / H``::

    q = x^q W_q^T + b_q,  k = x^k W_k^T + b_k,  v = x^v W_v^T + b_v     (split into heads)
    A = softmax(q k^T / sqrt(d)),  O = A v,  out = O W_o^T + b_o

The output cotangent ``delta`` (``[(D,) N, L, E]``) is pulled back by hand, per head:

    dO = delta W_o,  dA = dO v^T,  dv = A^T dO,  dS = A * (dA - rowsum(dA * A)),
    dq = dS k / sqrt(d),  dk = dS^T q / sqrt(d)

and every projection is a linear map over positions, so ``g_i(W_o) = sum_t delta_it O_it^T``,
``g_i(W_q) = sum_t dq_it x^q_it^T`` (likewise ``k``, ``v`` over the source positions),
``g_i(b) = sum_t`` of the same cotangents — batched matmuls over ``D x N x H``, no
``torch.func``. A call outside these conditions (masks, ``is_causal``, attention weights
that receive gradient, several rows per example) takes the generic path for that call.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fathom.seam.types import Call, Layer

_NAMES = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask")


def why_not_attention(m: nn.MultiheadAttention) -> str:
    """Why the module's geometry has no closed form here (``""`` when it has)."""
    if not m._qkv_same_embed_dim:
        return "separate q/k/v projection weights"
    if m.bias_k is not None or m.add_zero_attn:
        return "bias_k/bias_v or add_zero_attn"
    if m.training and m.dropout > 0:
        return f"dropout={m.dropout} in train() mode"
    return ""


def _arguments(call: Call) -> dict | None:
    """The call's query/key/value with the example dim first, or ``None`` when the call
    is outside the closed form (module docstring)."""
    got = dict(zip(_NAMES, call.args, strict=False)) | dict(call.kwargs)
    if any(got.get(k) is not None for k in ("key_padding_mask", "attn_mask")):
        return None
    if got.get("is_causal", False):
        return None
    leaves = call.input_leaves()
    dims = dict(zip(map(id, leaves), call.in_dims, strict=True))
    out = {}
    for name in ("query", "key", "value"):
        t = got.get(name)
        dim = dims.get(id(t)) if isinstance(t, torch.Tensor) else None
        if t is None or t.dim() != 3 or dim is None or dim[1] != 1:
            return None
        out[name] = t.detach().movedim(dim[0], 0)
    out["self"] = got["query"] is got["key"] is got["value"]  # self-attention, one input
    return out


Form = list[tuple[torch.Tensor, torch.Tensor | None]]  # (g [D, N, T, O], a [N, T, I] | None)


def attention_forms(
    m: nn.MultiheadAttention, call: Call, cot: list, n: int, directions: bool
) -> dict[str, Form] | None:
    """Per parameter, its row blocks as linear maps over positions: ``(g, a)`` pairs with
    ``g_i = sum_t g_it a_it^T`` (``a`` ``None``: a bias, ``g_i = sum_t g_it``), blocks
    stacked along the output rows (``in_proj_weight``: q, k, v); ``None`` when the call is
    outside the closed form (module docstring). ``g`` always has a leading ``D`` (1 without
    ``directions``)."""
    x = _arguments(call)
    out_dim = call.out_dims[0]
    weights_cot = cot[1] if len(cot) > 1 else None
    if x is None or out_dim is None or out_dim[1] != 1 or x["query"].shape[0] != n:
        return None
    if weights_cot is not None and bool(weights_cot.ne(0).any()):
        return None
    lead = 1 if directions else 0
    delta = cot[0].movedim(out_dim[0] + lead, lead)
    delta = delta if directions else delta[None]  # [D, N, L, E]
    heads, e = m.num_heads, m.embed_dim
    d, big_d, length = e // heads, delta.shape[0], delta.shape[2]
    w_b = (m.in_proj_weight.detach(), None if m.in_proj_bias is None else m.in_proj_bias.detach())
    w_q, w_k, w_v = w_b[0].chunk(3)
    b = w_b[1].chunk(3) if w_b[1] is not None else (None,) * 3

    def split(t: torch.Tensor) -> torch.Tensor:  # [N, L, E] -> [N, H, L, d]
        return t.unflatten(-1, (heads, d)).transpose(1, 2)

    def heads_last(t: torch.Tensor, rows: int) -> torch.Tensor:  # [N, H, D*rows, d] view
        return t.unflatten(2, (big_d, rows)).permute(0, 2, 3, 1, 4)  # [N, D, rows, H, d]

    def merge(t: torch.Tensor, rows: int) -> torch.Tensor:  # [N, H, D*rows, d] -> [D, N, rows, E]
        # stored example-major ([N, D, rows, E]): the curvature sums read it per example
        return heads_last(t, rows).reshape(n, big_d, rows, e).transpose(0, 1)

    if x["self"]:  # one input projected once
        q, k, v = (split(t) for t in F.linear(x["query"], *w_b).chunk(3, dim=-1))
    else:
        q = split(F.linear(x["query"], w_q, b[0]))
        k = split(F.linear(x["key"], w_k, b[1]))
        v = split(F.linear(x["value"], w_v, b[2]))
    src = k.shape[2]
    scale = 1.0 / math.sqrt(d)
    q_s, k_s = q * scale, k * scale
    a = torch.softmax(q_s @ k.transpose(-1, -2), dim=-1)  # [N, H, L, S]
    # directions folded into the rows: every product is one bmm over N x H, no broadcast copy
    d_o = (delta @ m.out_proj.weight.detach()).unflatten(-1, (heads, d))  # [D, N, L, H, d]
    d_o = d_o.permute(1, 3, 0, 2, 4).reshape(n, heads, big_d * length, d)
    d_a = (d_o @ v.transpose(-1, -2)).unflatten(2, (big_d, length))  # [N, H, D, L, S]
    a5 = a.unsqueeze(2)
    d_s = a5 * (d_a - (d_a * a5).sum(-1, keepdim=True))
    d_q = d_s.flatten(2, 3) @ k_s  # [N, H, D*L, d]
    d_k = d_s.transpose(-1, -2).flatten(2, 3) @ q_s  # [N, H, D*S, d]
    d_o_cols = d_o.unflatten(2, (big_d, length)).permute(0, 1, 3, 2, 4).flatten(3)
    d_v = (a.transpose(-1, -2) @ d_o_cols).unflatten(-1, (big_d, d))  # [N, H, S, D, d]
    d_v = d_v.transpose(2, 3).flatten(2, 3)  # [N, H, D*S, d]
    o = (a @ v).transpose(1, 2).flatten(2)  # [N, L, E]
    if x["self"]:  # the q/k/v rows one block (one product, not three), written once
        qkv = delta.new_empty(n, big_d, length, 3, heads, d)
        for j, t in enumerate((d_q, d_k, d_v)):
            qkv[:, :, :, j] = heads_last(t, length)
        blocks = [(qkv.reshape(n, big_d, length, 3 * e).transpose(0, 1), x["query"])]
    else:
        blocks = [
            (merge(t, r), x[w])
            for t, r, w in zip((d_q, d_k, d_v), (length, src, src), ("query", "key", "value"))
        ]
    forms: dict[str, Form] = {"in_proj_weight": blocks, "out_proj.weight": [(delta, o)]}
    if m.in_proj_bias is not None:
        forms["in_proj_bias"] = [(g, None) for g, _ in blocks]
    if m.out_proj.bias is not None:
        forms["out_proj.bias"] = [(delta, None)]
    return forms


def _form_grads(form: Form) -> torch.Tensor:
    """``[D, N, *shape]``: ``g_i = sum_t g_it a_it^T`` (or ``sum_t g_it``) per block, stacked."""
    blocks = [g.sum(-2) if a is None else g.transpose(-1, -2) @ a[None] for g, a in form]
    return torch.cat(blocks, dim=2) if len(blocks) > 1 else blocks[0]


def attention_grads(
    layer: Layer, call: Call, cot: list, n: int, directions: bool
) -> dict[str, torch.Tensor] | None:
    """``{local name: [(D,) N, *shape]}`` of one call for the layer's covered parameters, or
    ``None`` (the call takes the generic path instead)."""
    forms = attention_forms(layer.module, call, cot, n, directions)
    if forms is None:
        return None
    grads = {k: _form_grads(forms[k]) for k in layer.params}
    return grads if directions else {k: g[0] for k, g in grads.items()}
