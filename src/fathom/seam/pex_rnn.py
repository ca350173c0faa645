"""A functional forward of ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` for per-example gradients.

The fused recurrent kernels (``torch._VF.rnn_tanh`` / ``gru`` / ``lstm``) write their state
in place and have no ``vmap`` batching rule, so :func:`torch.func.functional_call` of the
module cannot be ``vmap``-ed over examples. :func:`_recurrent_forward` computes the same
function from the parameters ``q`` with out-of-place tensor ops, so the seam's per-example
path (``vjp`` of one example's call, ``vmap`` over examples, :mod:`fathom.seam.pex`) applies; the
discovery self-check compares its summed per-example gradients with autograd's batch
gradient of the module itself. Equations (PyTorch's documented ones), per layer ``l`` and
direction, with ``x_t`` the layer's input at step ``t`` (the reverse direction runs
``t = T-1 .. 0``) and gates in PyTorch's weight order:

* RNN: ``h_t = act(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)``, ``act`` tanh or ReLU;
* GRU (``r, z, n``): ``r = s(W_ir x + b_ir + W_hr h + b_hr)``, ``z = s(.. z ..)``,
  ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``, ``h_t = (1 - z) * n + z * h_{t-1}``;
* LSTM (``i, f, g, o``): ``c_t = s(f) c_{t-1} + s(i) tanh(g)``, ``h_t = s(o) tanh(c_t)``,
  then ``h_t = W_hr h_t`` with ``proj_size > 0``.

The input projections ``W_ih x_t + b_ih`` of all steps are one matmul; the ``T`` recurrent
steps run in a Python loop. **Cost:** per example chunk one forward and one ``vjp`` of this
unrolled graph — about the flops of a forward and backward of the batch (``O(N T L G H
(d_in + H))``, ``G`` gates) — plus ``N`` per-example gradients of every covered parameter in
memory; measured in ``BENCHMARKS.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from fathom.errors import FathomError


def _cell(mode: str, gi: torch.Tensor, h, c, w_hh, b_hh, w_hr):
    """One step: ``gi = W_ih x_t + b_ih`` precomputed; returns ``(h_t, c_t)``."""
    gh = F.linear(h, w_hh, b_hh)
    if mode == "RNN_TANH":
        return torch.tanh(gi + gh), None
    if mode == "RNN_RELU":
        return torch.relu(gi + gh), None
    if mode == "GRU":
        i_r, i_z, i_n = gi.chunk(3, -1)
        h_r, h_z, h_n = gh.chunk(3, -1)
        r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return (1 - z) * n + z * h, None
    i, f, g, o = (gi + gh).chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return (h if w_hr is None else F.linear(h, w_hr)), c


def _inputs(m: nn.RNNBase, args: tuple, kwargs: dict):
    x = args[0] if args else kwargs.get("input")
    hx = args[1] if len(args) > 1 else kwargs.get("hx")
    name = type(m).__name__
    if isinstance(x, PackedSequence):
        raise FathomError(
            f"{name} called on a PackedSequence: its example rows are interleaved by length, "
            "so the seam cannot split them per example; pass padded [N, T, F] tensors"
        )
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise FathomError(f"{name} needs batched [N, T, F] / [T, N, F] inputs for instruments")
    if m.training and m.dropout > 0:
        raise FathomError(
            f"{name} has dropout={m.dropout} between layers in train() mode: its forward is "
            "random; instruments run it in eval()"
        )
    return x, hx


def _recurrent_forward(m: nn.RNNBase, q: dict[str, torch.Tensor], args: tuple, kwargs: dict) -> Any:
    """``m(*args, **kwargs)`` computed from the parameters ``q`` (local names; a name not in
    ``q``, e.g. a frozen parameter, is read from ``m``): ``(output, h_n)``, for an LSTM
    ``(output, (h_n, c_n))``, shaped as the module returns them."""
    x, hx = _inputs(m, args, kwargs)
    seq = x.transpose(0, 1) if m.batch_first else x  # [T, B, F]
    dirs, lstm = (2 if m.bidirectional else 1), m.mode == "LSTM"
    h_size = m.proj_size if lstm and m.proj_size > 0 else m.hidden_size
    shape = (m.num_layers * dirs, seq.shape[1])
    if hx is None:
        zeros = seq.new_zeros
        h0, c0 = zeros(*shape, h_size), zeros(*shape, m.hidden_size) if lstm else None
    else:
        h0, c0 = hx if lstm else (hx, None)

    def w(name: str) -> torch.Tensor | None:
        return q[name] if name in q else getattr(m, name, None)

    hs, cs, layer_in = [], [], seq
    for layer in range(m.num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            gi = F.linear(layer_in, w(f"weight_ih{sfx}"), w(f"bias_ih{sfx}"))  # [T, B, G*H]
            h, c = h0[layer * dirs + d], (c0[layer * dirs + d] if lstm else None)
            steps = range(seq.shape[0] - 1, -1, -1) if d else range(seq.shape[0])
            out_t: list = [None] * seq.shape[0]
            for t in steps:
                h, c = _cell(
                    m.mode,
                    gi[t],
                    h,
                    c,
                    w(f"weight_hh{sfx}"),
                    w(f"bias_hh{sfx}"),
                    w(f"weight_hr{sfx}"),
                )
                out_t[t] = h
            outs.append(torch.stack(out_t))
            hs.append(h)
            cs.append(c)
        layer_in = torch.cat(outs, -1) if dirs == 2 else outs[0]
    out = layer_in.transpose(0, 1) if m.batch_first else layer_in
    h_n = torch.stack(hs)
    return (out, (h_n, torch.stack(cs))) if lstm else (out, h_n)


RECURRENT = (nn.RNN, nn.GRU, nn.LSTM)


@contextmanager
def functional_recurrent(module: nn.Module) -> Iterator[None]:
    """Inside the block every stock recurrent layer in ``module`` (itself included; its class
    ``forward``, no instance ``forward``) runs :func:`_recurrent_forward` on its current
    parameters (those a ``functional_call`` substituted), so the per-example path can
    ``vmap`` a module that contains one. Hooks still run (``__call__`` is unchanged)."""
    patched = []
    for m in module.modules():
        stock = any(isinstance(m, c) and type(m).forward is c.forward for c in RECURRENT)
        if stock and "forward" not in vars(m):
            m.forward = _bound(m)
            patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


def _bound(m: nn.RNNBase):
    def forward(*args, **kwargs):
        return _recurrent_forward(m, {}, args, kwargs)

    return forward
