"""Per-example parameter gradients and Gram matrices of one layer, from its captured calls.

Inputs: a :class:`fathom.seam.Layer`, its recorded calls and their output cotangents
(:meth:`fathom.seam.Seam.cotangents`), and ``n`` examples. With ``delta_i`` the cotangent
rows of example ``i`` (e.g. ``dL_i/dz_i`` for the unaveraged per-example loss ``L_i``):

* **linear** ``z = a W^T + b``, rows ``t`` of example ``i`` (positions, timesteps, calls):
  ``g_i(W) = sum_t delta_it a_it^T``, ``g_i(b) = sum_t delta_it``;
* **conv1d / conv2d** (:mod:`fathom.seam.pex_conv`): the same with ``a_it`` the input patch at
  output position ``t``; for one direction the sum over positions is the weight gradient of
  one grouped convolution whose groups are the examples (``aten.convolution_backward``, no
  unfolded copy of the patches, one chunk of examples at a time), or, where an example's
  patch is small (a stem on a few image channels), one batched matmul of its patches; for
  ``D`` directions one batched matmul of the unfolded patches with the ``D`` cotangents
  stacked as rows;
* **batchnorm / layernorm** (eval-mode BatchNorm, LayerNorm): ``g_i(w) = sum_t delta_it *
  x_hat_it``, ``g_i(b) = sum_t delta_it``; for BatchNorm with the examples first, both in one
  fused pass of torch's own BatchNorm backward over ``N*C`` channels;
* **embedding** (:mod:`fathom.seam.pex_embedding`): ``g_i(W)[v] = sum_{t: tok_it = v} delta_it``;
* **attention** (:mod:`fathom.seam.pex_attention`): projections as linear maps over positions;
* **generic**: ``g_i = vjp(theta -> module(theta; inputs_i), delta_i)`` by ``torch.func``
  (``functional_call`` + ``vjp``, ``vmap`` over examples in chunks of ``chunk_size``).

Gram matrices ``K_ij = g_i . g_j`` (float64): for a linear layer with one row per example
``K = (A A^T) * (Delta Delta^T)`` (elementwise, :func:`gradient_gram`,
cost ``N^2 (d_in + d_out)``); otherwise ``K = G G^T`` from the materialized ``G = [g_i]``.
Directions (``directions=True``): every cotangent has a leading ``D`` and the gradients come
back as ``[D, N, *shape]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import vjp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import _pytree as pytree

from fathom.errors import FathomError
from fathom.seam.discovery import preserved
from fathom.seam.pex_attention import attention_grads
from fathom.seam.pex_conv import conv_form, conv_grads
from fathom.seam.pex_embedding import embedding_grads
from fathom.seam.pex_functional import add_grads, module_fn, op_fn
from fathom.seam.types import Call, Layer

Cotangents = list[list[torch.Tensor | None]]  # per call, per output leaf
_ELEMENTS = 2**24  # per chunk: examples x directions x covered parameters (memory bound)


def _split(t: torch.Tensor, dim: tuple[int, int] | None, n: int, where: str, lead: int = 0):
    """``[.., N*k at d, ..] -> [.., N, k, ..]`` (example dim at ``d + lead``)."""
    if dim is None:
        raise FathomError(f"{where} has no example dimension")
    d, k = dim
    d += lead
    if t.shape[d] != n * k:
        raise FathomError(
            f"{where}: dimension {d} has {t.shape[d]} entries, expected {n} examples x {k}"
        )
    return t.unflatten(d, (n, k)), d


def linear_rows(
    layer: Layer, calls: list[Call], cots: Cotangents, n: int, *, directions: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A [N, T, d_in], Delta [(D,) N, T, d_out])`` of a linear or conv layer, every call.

    Row ``t`` of example ``i`` is one position (sequence entry, timestep, output pixel with
    its unfolded patch, ``F.unfold`` channel-major matching ``W.reshape(C_out, -1)``) of one
    call; calls are concatenated along ``T``, so that ``g_i = sum_t delta_it a_it^T`` is
    example ``i``'s weight gradient (KFAC factors and curvature diagonals read the same rows).
    """
    forms = [_linear_form(layer, c, t, n, directions) for c, t in zip(calls, cots, strict=True)]
    if len(forms) == 1:
        return forms[0]
    return torch.cat([f[0] for f in forms], dim=1), torch.cat([f[1] for f in forms], dim=-2)


def _linear_form(layer: Layer, call: Call, cot: list, n: int, directions: bool):
    """``(A [N, T, d_in], Delta [(D,) N, T, d_out])`` of one call (``T`` rows per example)."""
    if layer.kind in ("conv1d", "conv2d"):
        return conv_form(layer, call, cot, n, directions)
    x = call.input_leaves()[0].detach()
    d_cot = cot[0]
    lead = 1 if directions else 0
    where = f"layer {layer.name!r}"
    a, d = _split(x, call.in_dims[0], n, where)
    a = a.movedim((d, d + 1), (0, 1)).reshape(n, -1, x.shape[-1])
    g, dd = _split(d_cot, call.out_dims[0], n, where, lead)
    g = g.movedim((dd, dd + 1), (lead, lead + 1))
    return a, g.reshape(*g.shape[:lead], n, -1, d_cot.shape[-1])


def _linear_grads(layer, call, cot, n, directions) -> dict[str, torch.Tensor]:
    a, g = _linear_form(layer, call, cot, n, directions)
    spec = "cnto,nti->cnoi" if directions else "nto,nti->noi"
    out = {"weight": torch.einsum(spec, g, a)}
    if "bias" in layer.params:
        out["bias"] = g.sum(dim=-2)
    return out


def _per_example_sum(t, ex: int, k: int, feat: tuple[int, ...], n: int, lead: int):
    """``[(D,) .., N*k at ex, .., F..]`` -> ``[(D,) N, F..]``: sum over every non-feature entry
    of each example (its ``k`` rows and all positions)."""
    t = t.movedim((ex + lead, *(f + lead for f in feat)), tuple(range(lead, lead + 1 + len(feat))))
    t = t.unflatten(lead, (n, k))
    t = t.squeeze(lead + 1) if k == 1 else t.sum(dim=lead + 1)  # (a sum over one row: a copy)
    rest = tuple(range(lead + 1 + len(feat), t.dim()))
    return t.sum(dim=rest) if rest else t


def _norm_grads(layer, call, cot, n, directions) -> dict[str, torch.Tensor]:
    """BatchNorm (eval) / LayerNorm affine ``y = x_hat * w + b``: ``g_i(w) = sum_t delta_it
    x_hat_it``, ``g_i(b) = sum_t delta_it``, ``x_hat`` recomputed from the captured input."""
    m, x, g = layer.module, call.input_leaves()[0].detach(), cot[0]
    if call.in_dims[0] is None or call.out_dims[0] != call.in_dims[0]:
        raise FathomError(f"layer {layer.name!r}: input and output need one example dimension")
    if layer.kind == "batchnorm" and not directions:
        fused = _batchnorm_grads(m, x, g, call.in_dims[0], n, "bias" in layer.params)
        if fused is not None:
            return fused
    if layer.kind == "batchnorm":
        shape = [1, -1] + [1] * (x.dim() - 2)
        x_hat = (x - m.running_mean.view(shape)).mul_(
            torch.rsqrt(m.running_var.view(shape) + m.eps)
        )
        feat: tuple[int, ...] = (1,)
    else:
        x_hat = F.layer_norm(x, m.normalized_shape, None, None, m.eps)
        feat = tuple(range(x.dim() - len(m.normalized_shape), x.dim()))
    ex, k = call.in_dims[0]
    lead = 1 if directions else 0
    fits = g.shape == x_hat.shape and g.dtype == x_hat.dtype  # x_hat is ours: in place
    out = {"weight": _per_example_sum(x_hat.mul_(g) if fits else g * x_hat, ex, k, feat, n, lead)}
    if "bias" in layer.params:
        out["bias"] = _per_example_sum(g, ex, k, feat, n, lead)
    return out


def _batchnorm_grads(m, x, g, dim, n: int, bias: bool) -> dict[str, torch.Tensor] | None:
    """Eval-mode BatchNorm, examples first: ``g_i(w)_c = rstd_c sum_t delta_itc (x_itc -
    mu_c)`` and ``g_i(b)_c = sum_t delta_itc`` in one fused pass, by torch's own
    BatchNorm backward (``aten.native_batch_norm_backward``, running statistics, no input
    gradient) run on the input viewed as one example with ``N*k*C`` channels
    (``[N*k, C, ...] -> [1, N*k*C, prod(...)]``, the running statistics repeated per row), so
    that each of its channels is one (row, channel) pair; the ``k`` rows of an example are
    then summed. ``rstd_c = 1 / sqrt(var_c + eps)``. The formula of :func:`_norm_grads`
    with its product ``x_hat * delta`` never stored (the same terms, summed in the
    kernel's order: the last bits may differ). ``None`` where the layout does not fit (the
    example dimension not first, a strided tensor, no running statistics): the caller takes
    the general path."""
    ex, k = dim
    mean, var = m.running_mean, m.running_var
    fits = (
        ex == 0
        and x.dim() >= 2
        and mean is not None
        and var is not None
        and g.shape == x.shape
        and g.dtype == x.dtype == mean.dtype == var.dtype
        and x.is_contiguous()
        and g.is_contiguous()
    )
    if not fits:
        return None
    rows = x.shape[0]
    flat = (1, rows * x.shape[1], -1)
    _, w, b = torch.ops.aten.native_batch_norm_backward(
        g.reshape(flat),
        x.reshape(flat),
        None,
        mean.repeat(rows),
        var.repeat(rows),
        None,
        None,
        False,
        m.eps,
        [False, True, bias],
    )

    def per_example(t: torch.Tensor) -> torch.Tensor:
        t = t.view(n, k, x.shape[1])
        return t.squeeze(1) if k == 1 else t.sum(dim=1)

    out = {"weight": per_example(w)}
    if bias:
        out["bias"] = per_example(b)
    return out


def _fast_grads(layer, calls, cots, n, directions) -> dict[str, torch.Tensor]:
    fns = {
        "linear": _linear_grads,
        "batchnorm": _norm_grads,
        "layernorm": _norm_grads,
        "embedding": embedding_grads,
    }
    fn = fns.get(layer.kind, conv_grads)
    total: dict[str, torch.Tensor] = {}
    for call, cot in zip(calls, cots, strict=True):
        g = fn(layer, call, cot, n, directions)
        # a closed-form root ``x + p`` gives only ``p``: the layer's other parameters get
        # theirs from the calls that read them
        total = {k: total[k] + v if k in total else v for k, v in g.items()} | {
            k: v for k, v in total.items() if k not in g
        }
    return total


def _batched(leaves, dims, n, where, lead=0):
    """Leaves with an example dim reshaped to ``[.., N, k, ..]`` and their vmap in_dims."""
    values, in_dims = [], []
    for t, dim in zip(leaves, dims, strict=True):
        if isinstance(t, torch.Tensor):
            t = t.detach()
        if dim is None or t is None:
            values.append(t)
            in_dims.append(None)
        else:
            v, d = _split(t, dim, n, where, lead)
            values.append(v)
            in_dims.append(d)
    return values, in_dims


def _generic_call(layer: Layer, call: Call, cot: list, n: int, directions: bool, chunk: int):
    where = f"module {layer.name!r} ({layer.type_name})"
    leaves, spec = pytree.tree_flatten((call.args, call.kwargs))
    tensors = layer.tensors()
    slots = {j: k for j, leaf in enumerate(leaves) for k, t in tensors.items() if leaf is t}
    ins, in_dims = _batched(leaves, call.in_dims, n, where)
    keep = [j for j, t in enumerate(cot) if t is not None]
    for j in keep:
        if call.out_dims[j] is None and bool(cot[j].ne(0).any()):
            raise FathomError(f"{where}: an output without an example dimension gets gradient")
    keep = [j for j in keep if call.out_dims[j] is not None]
    lead = 1 if directions else 0
    cts, ct_dims = _batched(
        [cot[j] for j in keep], [call.out_dims[j] for j in keep], n, where, lead
    )
    params = {k: v.detach() for k, v in tensors.items()}
    fn = op_fn(call.func, spec, slots) if layer.kind == "op" else module_fn(layer, spec, slots)

    def one(p: dict, example_ins: list, example_cts: list) -> dict:
        def f(q: dict) -> tuple:
            outs = pytree.tree_leaves(fn(q, list(example_ins)))
            return tuple(outs[j] for j in keep)

        _, pull = vjp(f, p)
        if directions:
            return vmap(pull)(tuple(example_cts))[0]
        return pull(tuple(example_cts))[0]

    with sdpa_kernel(SDPBackend.MATH), preserved(layer.root or layer.module):
        g = vmap(one, in_dims=(None, in_dims, ct_dims), chunk_size=chunk)(params, ins, cts)
    return {k: v.transpose(0, 1) if directions else v for k, v in g.items()}


def _masked_op_call(layer: Layer, call: Call, cot: list, n: int, directions: bool):
    """A root operation (kind ``op``) that does not split per example (e.g. ``p.expand(-1,
    n, -1)``: no input has an example dimension): run once on the batch, its ``vjp`` applied
    to ``N`` cotangents each restricted to one example's rows, ``g_i = J^T (delta * 1_i)``
    (exact for any operation: example ``i``'s loss reaches the parameter through its rows)."""
    leaves, spec = pytree.tree_flatten((call.args, call.kwargs))
    tensors = layer.tensors()
    slots = {j: k for j, leaf in enumerate(leaves) for k, t in tensors.items() if leaf is t}
    keep = [j for j, t in enumerate(cot) if t is not None and call.out_dims[j] is not None]
    fn = op_fn(call.func, spec, slots)
    base = [v.detach() if isinstance(v, torch.Tensor) else v for v in leaves]

    def f(q: dict) -> tuple:
        outs = pytree.tree_leaves(fn(q, base))
        return tuple(outs[j] for j in keep)

    _, pull = vjp(f, {k: v.detach() for k, v in tensors.items()})
    lead = 1 if directions else 0
    masked = []
    for j in keep:
        c, (d, k) = cot[j], call.out_dims[j]
        rows = torch.eye(n, dtype=c.dtype, device=c.device).repeat_interleave(k, dim=1)
        masked.append(
            c.unsqueeze(0) * rows.view(n, *[1] * (d + lead), n * k, *[1] * (c.dim() - d - lead - 1))
        )
    g = vmap(vmap(pull) if directions else pull)(tuple(masked))[0]
    return {key: v.transpose(0, 1) if directions else v for key, v in g.items()}


def per_example_grads(
    layer: Layer,
    calls: list[Call],
    cots: Cotangents,
    n: int,
    *,
    directions: bool = False,
    chunk_size: int | None = None,
) -> dict[str, torch.Tensor]:
    """``{local param name: g}``, ``g[i] = sum over calls of example i's gradient``.

    Shapes ``[N, *param.shape]`` (``[D, N, *param.shape]`` with ``directions``: one
    direction at a time where :attr:`~fathom.seam.Layer.loop_directions`); a layer that did
    not run (a skipped branch) gets exact zeros.
    """
    tensors = layer.tensors()
    d = cots[0][0].shape[0] if directions and calls and cots[0][0] is not None else None
    if d is not None and layer.loop_directions:  # torch's batched pullback fails here
        one = [[[None if t is None else t[k] for t in c] for c in cots] for k in range(d)]
        per = [per_example_grads(layer, calls, c, n, chunk_size=chunk_size) for c in one]
        return {key: torch.stack([g[key] for g in per]) for key in per[0]}
    if not calls:
        lead = (d,) if d else ()
        return {k: torch.zeros(*lead, n, *t.shape, dtype=t.dtype) for k, t in tensors.items()}
    if layer.kind not in ("generic", "recurrent", "attention", "op"):
        return _fast_grads(layer, calls, cots, n, directions)
    size = sum(t.numel() for t in tensors.values()) * (d or 1)
    chunk = chunk_size or max(1, min(n, _ELEMENTS // max(size, 1)))
    total: dict[str, torch.Tensor] = {}
    for call, cot in zip(calls, cots, strict=True):
        g = attention_grads(layer, call, cot, n, directions) if layer.kind == "attention" else None
        if layer.kind == "op":  # a root ``x + p``: closed form
            g = add_grads(call, cot, tensors, directions)
        if g is None and layer.kind == "op":
            try:  # per example where the operation splits so, else by masked cotangents
                g = _generic_call(layer, call, cot, n, directions, chunk)
            except Exception:
                g = _masked_op_call(layer, call, cot, n, directions)
        if g is None:  # (an attention call outside its closed form too)
            g = _generic_call(layer, call, cot, n, directions, chunk)
        # a closed-form root ``x + p`` gives only ``p``: the layer's other parameters get
        # theirs from the calls that read them
        total = {k: total[k] + v if k in total else v for k, v in g.items()} | {
            k: v for k, v in total.items() if k not in g
        }
    return total


def per_example_grams(
    layer: Layer, calls: list[Call], cots: Cotangents, n: int, *, chunk_size: int | None = None
) -> dict[str, torch.Tensor]:
    """``{local param name: K}``, ``K_ij = g_i . g_j`` in float64, shape ``[N, N]``."""
    if layer.kind == "linear" and len(calls) == 1:
        a, g = _linear_form(layer, calls[0], cots[0], n, False)
        if a.shape[1] == 1:  # one row per example: never materialize g_i
            out = {"weight": gradient_gram(a[:, 0], g[:, 0])}
            if "bias" in layer.params:
                d64 = g[:, 0].detach().to(torch.float64)
                out["bias"] = d64 @ d64.T
            return out
    grads = per_example_grads(layer, calls, cots, n, chunk_size=chunk_size)
    return {k: _gram(v) for k, v in grads.items()}


def gram_and_bias_mean(
    layer: Layer,
    calls: list[Call],
    cots: Cotangents,
    n: int,
    *,
    chunk_size: int | None = None,
    input_gram: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(K, m_b)``: the weights' Gram ``K = sum_{p in weights} K(p)`` (float64 ``[N, N]``)
    and the biases' mean gradient ``m_b = (1/N) sum_i g_i(b)`` (float64, biases concatenated);
    ``None`` for a layer without weights / biases. Per-example gradients are computed once.
    ``input_gram``: :func:`rows_gram` or a caller's stand-in for it (one that reuses the
    product of inputs it has seen, bit for bit, before)."""
    if layer.kind == "linear" and len(calls) == 1:
        a, g = _linear_form(layer, calls[0], cots[0], n, False)
        if a.shape[1] == 1:  # one row per example: never materialize g_i
            d64 = g[:, 0].detach().to(torch.float64)  # (once, for the bias mean and the Gram)
            bias = d64.mean(dim=0) if layer.biases else None
            return gradient_gram(a[:, 0], d64, input_gram=input_gram), bias
    grads = per_example_grads(layer, calls, cots, n, chunk_size=chunk_size)
    k = summed_gram({p: _gram(grads[p]) for p in layer.weights}, layer.weights)
    bias = (
        torch.cat(
            [grads[b].detach().reshape(n, -1).to(torch.float64) for b in layer.biases], 1
        ).mean(dim=0)
        if layer.biases
        else None
    )
    return k, bias


def gradient_gram(
    a: torch.Tensor,
    delta: torch.Tensor,
    *,
    include_bias: bool = False,
    input_gram: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``K_ij = g_i . g_j = (a_i . a_j + [bias]) (delta_i . delta_j)``, float64, shape ``(N, N)``.

    The Gram of the per-example weight gradients ``g_i = delta_i a_i^T`` of an affine layer
    with one row per example, without forming them (``input_gram``: see
    :func:`gram_and_bias_mean`).
    """
    d64 = delta.detach().reshape(delta.shape[0], -1).to(torch.float64)
    ka = (input_gram or rows_gram)(a.detach().reshape(a.shape[0], -1))
    if include_bias:
        ka = ka + 1.0
    return ka * (d64 @ d64.T)


def rows_gram(a: torch.Tensor) -> torch.Tensor:
    """``A A^T`` in float64 of the ``[N, d]`` rows ``a_i`` (``(A A^T)_ij = a_i . a_j``)."""
    a64 = a.to(torch.float64)
    return a64 @ a64.T


def _gram(g: torch.Tensor) -> torch.Tensor:
    flat = g.detach().reshape(g.shape[0], -1).to(torch.float64)
    return flat @ flat.T


def summed_gram(grams: dict[str, torch.Tensor], names: Any) -> torch.Tensor | None:
    """``sum_p K(p)`` over the named parameters (``None`` when there are none)."""
    chosen = [grams[p] for p in names]
    if not chosen:
        return None
    out = chosen[0]
    for k in chosen[1:]:
        out = out + k
    return out
