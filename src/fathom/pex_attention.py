"""Per-example gradients of ``nn.MultiheadAttention`` in closed form (see :mod:`fathom.pex`).

For a call ``out = MHA(query, key, value)`` without masks, without ``bias_k``/``bias_v`` or
``add_zero_attn``, with one embedding size for query, key and value, and no dropout: with
``q = query W_q^T + b_q`` (likewise ``k``, ``v``; ``[W_q; W_k; W_v] = in_proj_weight``), ``o``
the heads' ``softmax(q_h k_h^T / sqrt(d_h)) v_h`` merged back to ``[L, E]`` and
``out = o W_o^T + b_o``, and ``delta_it`` the cotangent of ``out`` at position ``t`` of
example ``i``:

* ``g_i(W_o) = sum_t delta_it o_it^T``, ``g_i(b_o) = sum_t delta_it``;
* ``delta^o = delta W_o``, pulled back through the attention core to ``(delta^q, delta^k,
  delta^v)`` by one ordinary backward over the examples repeated once per direction (rows
  of that batch are independent, so no ``vmap`` and no per-example loop);
* ``g_i(W_q) = sum_t delta^q_it query_it^T``, ``g_i(b_q) = sum_t delta^q_it`` (likewise ``k``,
  ``v`` over the key/value positions), stacked as ``in_proj_weight`` / ``in_proj_bias``.

A call outside these conditions (a mask, ``is_causal``, attention weights that receive
gradient, dropout in training) returns ``None`` and takes the generic ``torch.func`` path.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from fathom.seam import Call, Layer

_SIGNATURE = inspect.signature(nn.MultiheadAttention.forward)


def plain_attention(module: nn.Module) -> bool:
    """An unmodified ``nn.MultiheadAttention`` this closed form covers (module docstring)."""
    return (
        isinstance(module, nn.MultiheadAttention)
        and type(module).forward is nn.MultiheadAttention.forward
        and module._qkv_same_embed_dim
        and module.bias_k is None
        and module.bias_v is None
        and not module.add_zero_attn
    )


def _arguments(m: nn.Module, call: Call) -> dict | None:
    bound = _SIGNATURE.bind(m, *call.args, **call.kwargs)
    bound.apply_defaults()
    a = bound.arguments
    if a["key_padding_mask"] is not None or a["attn_mask"] is not None or a["is_causal"]:
        return None
    if m.training and m.dropout > 0:
        return None
    tensors = (a["query"], a["key"], a["value"])
    if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in tensors):
        return None
    return a


def _rows(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``sum_t g_dit x_it^T`` per direction and example: ``[D, N, out, in]``."""
    return torch.einsum("dnto,nti->dnoi", g, x)


def attention_grads(layer: Layer, call: Call, cot: list, n: int, directions: bool):
    """``{local name: [(D,) N, *shape]}`` of one call, or ``None`` (generic path instead)."""
    m = layer.module
    a = _arguments(m, call)
    bdim = 0 if m.batch_first else 1
    extra = [t for t in cot[1:] if t is not None and bool(t.ne(0).any())]
    if a is None or extra or call.out_dims[0] != (bdim, 1) or cot[0] is None:
        return None
    delta = cot[0] if directions else cot[0].unsqueeze(0)
    if not m.batch_first:
        delta = delta.transpose(1, 2)
    q_in, k_in, v_in = (
        (t if m.batch_first else t.transpose(0, 1)).detach()
        for t in (a["query"], a["key"], a["value"])
    )
    d, e, h = delta.shape[0], m.embed_dim, m.num_heads
    w = m.in_proj_weight.detach().chunk(3)
    b = m.in_proj_bias.detach().chunk(3) if m.in_proj_bias is not None else (None,) * 3
    w_o = m.out_proj.weight.detach()

    def projected(x, i):  # the D-fold repeated projection, a leaf of the recomputed core
        p = F.linear(x, w[i], b[i])
        return p.unsqueeze(0).expand(d, *p.shape).reshape(d * n, *p.shape[1:]).requires_grad_()

    with torch.enable_grad():
        q, k, v = projected(q_in, 0), projected(k_in, 1), projected(v_in, 2)

        def heads(t):
            return t.view(t.shape[0], t.shape[1], h, e // h).transpose(1, 2)

        o = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
        o = o.transpose(1, 2).reshape(d * n, q.shape[1], e)
        d_o = (delta.reshape(d * n, -1, e) @ w_o).contiguous()
        gq, gk, gv = torch.autograd.grad(o, (q, k, v), d_o)
    o_n = o.detach()[:n]
    grads = [g.view(d, n, *g.shape[1:]) for g in (gq, gk, gv)]
    out = {
        "in_proj_weight": torch.cat([_rows(x, g) for x, g in zip((q_in, k_in, v_in), grads)], 2),
        "out_proj.weight": _rows(o_n, delta),
    }
    if m.in_proj_bias is not None:
        out["in_proj_bias"] = torch.cat([g.sum(2) for g in grads], 2)
    if m.out_proj.bias is not None:
        out["out_proj.bias"] = delta.sum(2)
    return {p: out[p] if directions else out[p][0] for p in layer.params}
