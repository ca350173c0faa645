"""Per-example gradients of ``nn.Embedding`` in closed form: see :mod:`fathom.seam.pex`.

With ``tok_it`` example ``i``'s token at position ``t`` and ``delta_it`` the cotangent of
its output row, ``g_i(W)[v] = sum_{t : tok_it = v} delta_it`` (rows never looked up get
zero; the row ``padding_idx`` gets zero, as autograd gives it). One ``index_add`` into the
``[(D,) N * V, E]`` result, no ``torch.func``: the cost is that of writing the per-example
gradients, ``N V E`` (times ``D`` directions).
"""

from __future__ import annotations

import torch

from fathom.errors import FathomError
from fathom.seam.types import Call, Layer


def _rows(layer: Layer, call: Call, cot: list, n: int, directions: bool):
    """``(rows [(D,) N * T, E], slot [N * T], V)``: each looked-up row's cotangent (zero at
    ``padding_idx``) and its slot ``i * V + tok_it`` in the ``[N * V]`` per-example rows."""
    m = layer.module
    idx, g = call.input_leaves()[0], cot[0]
    if call.in_dims[0] is None or call.out_dims[0] is None:
        raise FathomError(f"layer {layer.name!r}: an embedding needs per-example token ids")
    ex, k = call.in_dims[0]
    lead = 1 if directions else 0
    tok = idx.movedim(ex, 0).unflatten(0, (n, k)).reshape(n, -1)  # [N, T]
    oex, ok = call.out_dims[0]
    rows = g.movedim(oex + lead, lead).unflatten(lead, (n, ok))
    rows = rows.reshape(*rows.shape[:lead], n, -1, g.shape[-1])  # [(D,) N, T, E]
    if m.padding_idx is not None:
        keep = tok != m.padding_idx
        rows = rows * keep.unsqueeze(-1).to(rows.dtype)
    vocab = m.weight.shape[0]
    flat = (tok + vocab * torch.arange(n, device=tok.device)[:, None]).reshape(-1)
    return rows.reshape(*rows.shape[:lead], -1, g.shape[-1]), flat, vocab


def embedding_grads(layer: Layer, call: Call, cot: list, n: int, directions: bool):
    """``{"weight": [(D,) N, V, E]}`` of one call."""
    rows, flat, vocab = _rows(layer, call, cot, n, directions)
    lead = 1 if directions else 0
    out = rows.new_zeros(*rows.shape[:lead], n * vocab, rows.shape[-1])
    out.index_add_(lead, flat, rows)
    return {"weight": out.unflatten(lead, (n, vocab))}


def embedding_pairs(layer: Layer, call: Call, cot: list, n: int, *, examples: bool = False):
    """``(rows [D, P, E], tokens [P])``: the non-zero rows of :func:`embedding_grads` only,
    one per (example, token) pair that occurs (``P <= N T`` instead of ``N V``): row ``p``
    is example ``i``'s gradient row of token ``tokens[p]``; ``examples=True`` adds the third
    ``[P]``, each pair's example ``i``."""
    rows, flat, vocab = _rows(layer, call, cot, n, True)
    pairs, slot = torch.unique(flat, return_inverse=True)
    out = rows.new_zeros(rows.shape[0], pairs.shape[0], rows.shape[-1])
    out = out.index_add_(1, slot, rows)
    return (out, pairs % vocab, pairs // vocab) if examples else (out, pairs % vocab)
