"""The functions the generic per-example path of :mod:`fathom.seam.pex` differentiates.

:func:`module_fn` is one call of a layer's module with its covered parameters substituted
(``functional_call`` of a scope over the root, so a parameter the module uses but does not
own — a sibling's weight, a parametrization's original, an argument — is substituted too);
:func:`op_fn` is one torch operation of the root's own ``forward`` (kind ``op``) with its
parameters substituted where the captured call received them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils import _pytree as pytree

from fathom.seam.pex_rnn import functional_recurrent
from fathom.seam.types import Layer


class _Scope(nn.Module):
    """``forward(args, kwargs) = target(*args, **kwargs)`` inside ``root``: a
    ``functional_call`` of the scope substitutes any of the root's parameters (by qualified
    name, tied aliases too) while only ``target`` runs — a parameter the target uses but
    does not own (a sibling's weight, a parametrization's original) is substituted too."""

    def __init__(self, root: nn.Module, target: nn.Module) -> None:
        super().__init__()
        self.root = root
        object.__setattr__(self, "target", target)  # not registered: no second name

    def forward(self, args: tuple, kwargs: dict) -> Any:
        return self.target(*args, **kwargs)


def _locations(layer: Layer) -> dict[str, list[str]]:
    """Per key, the scope names of every *distinct* place its parameter sits (a tied weight
    under two modules: both; a module registered under two names: once, or restoring the
    second name would write back the substituted tensor)."""
    assert layer.root is not None
    wanted = {id(t): k for k, t in layer.tensors().items()}
    out: dict[str, list[str]] = {k: [] for k in layer.params}
    seen: set[tuple[int, str]] = set()
    for name, p in layer.root.named_parameters(remove_duplicate=False):
        path, _, attr = name.rpartition(".")
        where = (id(layer.root.get_submodule(path)), attr)
        if id(p) in wanted and where not in seen:
            seen.add(where)
            out[wanted[id(p)]].append("root." + name)
    return out


def module_fn(layer: Layer, spec, slots: dict[int, str]):
    """``f(q, leaves) -> output`` of one call of the layer with its parameters ``q`` (keys
    of ``layer.params``): the input leaves at ``slots`` are parameters passed as arguments,
    replaced by ``q`` (by identity of the captured leaf)."""
    scope = _Scope(layer.root, layer.module) if layer.root is not None else None
    names = _locations(layer) if scope is not None else {}

    def f(q: dict, leaves: list) -> Any:
        leaves = [q[slots[j]] if j in slots else v for j, v in enumerate(leaves)]
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        with functional_recurrent(layer.module):
            if scope is None:
                return functional_call(layer.module, q, args, kwargs)
            subs = {n: v for k, v in q.items() for n in names[k]}
            return functional_call(scope, subs, (args, kwargs), tie_weights=False)

    return f


def op_fn(func, spec, slots: dict[int, str]):
    """``f(q, leaves) -> output`` of one root operation (kind ``op``) with its parameters
    ``q`` substituted at ``slots``."""

    def f(q: dict, leaves: list) -> Any:
        leaves = [q[slots[j]] if j in slots else v for j, v in enumerate(leaves)]
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        return func(*args, **kwargs)

    return f


_ADDS = (torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__)


def add_grads(call, cot: list, tensors: dict, directions: bool) -> dict | None:
    """A root ``x + p`` (``p`` a covered parameter, ``x`` batched one row per example, no
    ``alpha``) in closed form: ``d(x + p)/dp`` broadcasts ``p``, so example ``i``'s gradient
    is its output cotangent summed over the dims ``p`` is broadcast along,
    ``g_i = sum_to_size(delta_i, p.shape)``; ``None`` outside these conditions (the generic
    path then differentiates the call)."""
    args = call.args
    if call.func not in _ADDS or call.kwargs or len(args) != 2 or len(call.out_dims) != 1:
        return None
    names = [next((k for k, t in tensors.items() if a is t), None) for a in args]
    if sum(k is not None for k in names) != 1 or cot[0] is None or call.out_dims[0] is None:
        return None
    name = names[0] or names[1]
    p, (d, rows) = tensors[name], call.out_dims[0]
    delta = cot[0] if directions else cot[0][None]
    shape = (1,) * (delta.dim() - 1 - p.dim()) + tuple(p.shape)  # p right-aligned to the output
    if rows != 1 or len(shape) != delta.dim() - 1 or shape[d] != 1:
        return None
    g = delta.movedim(d + 1, 1)  # [D, N, rest...]
    rest = shape[:d] + shape[d + 1 :]
    dims = [j + 2 for j, (s, t) in enumerate(zip(rest, g.shape[2:], strict=True)) if s != t]
    if any(rest[j - 2] != 1 for j in dims):
        return None
    g = (g.sum(dims, keepdim=True) if dims else g).reshape(g.shape[0], g.shape[1], *p.shape)
    return {name: g if directions else g[0]}
