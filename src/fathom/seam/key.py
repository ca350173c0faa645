"""The structure key of a model: everything a seam depends on besides parameter values.

One key serves both caches that hold a seam: the curvature float64 twin
(:mod:`fathom.curvature.twin`) and :class:`fathom.Instruments` (which re-derives its seam
whenever the key changes). :func:`structure_key` covers:

* every module (``named_modules``, duplicates kept): its qualified name, object identity,
  class and the class's ``forward``, its ``training`` flag, and every other attribute of
  its ``__dict__`` (numbers, strings, tuples by value, hooks by identity, tensors that are
  not parameters or buffers by identity and in-place version, anything else by type and
  identity) — a module swapped, ``train()`` / ``eval()`` toggled, a stride or ``eps`` or a
  custom flag changed, a hook or an instance-level ``forward`` added. The stochastic-depth
  state that dense evaluation overrides (:data:`_DENSE_IGNORED`: a branch's ``gain``,
  ``mask``, drop probability and generator) is left out: it never enters a dense forward,
  and a key that changed at every step would rediscover the seam at every observation;
* every parameter and buffer: name, identity, shape, dtype, device and ``requires_grad``
  (so ``.double()``, ``.to(device)``, a replaced tensor, a frozen or unfrozen parameter
  change the key; in-place value updates, e.g. an optimizer step, do not);
* the probe inputs' per-example shape, dtype and device.

What the key cannot see is state outside the model that its ``forward`` reads (a global,
a closure). Identities are sound only while the objects they name live: ``held`` lists
them, and a cache keeps it beside the key so that no identity can be reused meanwhile.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from fathom.depth import SkippableResidual
from fathom.seam.inputs import signature

_OWN = frozenset({"_parameters", "_buffers", "_modules", "training"})
_DENSE_IGNORED: dict[type, frozenset[str]] = {
    SkippableResidual: frozenset({"gain", "mask", "_p", "generator"}),
}


def _value_key(v: Any, held: list, depth: int = 0) -> Any:
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return v
    if type(v) in _EMPTY_KEYS and not v:  # a module's many empty hook dicts, fast
        return _EMPTY_KEYS[type(v)]
    if depth < 3 and isinstance(v, (tuple, list, set, frozenset)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return (type(v).__name__, tuple(_value_key(e, held, depth + 1) for e in items))
    if depth < 3 and isinstance(v, dict):
        return ("dict", tuple((repr(k), _value_key(e, held, depth + 1)) for k, e in v.items()))
    held.append(v)
    if isinstance(v, torch.Tensor):
        return ("tensor", id(v), v._version, tuple(v.shape), str(v.dtype), str(v.device))
    return (type(v).__qualname__, id(v))


_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})  # exact types
_EMPTY_KEYS = {
    dict: ("dict", ()),
    OrderedDict: ("dict", ()),
    tuple: ("tuple", ()),
    list: ("list", ()),
}


def _tensor_key(name: str, t: torch.Tensor | None, held: list) -> tuple:
    if t is None:
        return (name, None)
    held.append(t)
    return (name, id(t), tuple(t.shape), str(t.dtype), str(t.device), t.requires_grad)


def _ignored(m: nn.Module) -> frozenset[str]:
    out = _OWN
    for cls, names in _DENSE_IGNORED.items():
        if isinstance(m, cls):
            out = out | names
    return out


def structure_key(model: nn.Module, x: Any) -> tuple[tuple, list]:
    """``(key, held)``: everything a seam of ``model`` on inputs like ``x`` depends on
    besides parameter and buffer values (module docstring), and the objects whose
    identities the key holds (the model itself excepted)."""
    held: list = []
    modules = []
    for name, m in model.named_modules(remove_duplicate=False):
        skip = _ignored(m)
        attrs = tuple(
            # (the common cases of _value_key inline: plain scalars, a module's empty hook dicts)
            (k, v if type(v) in _SCALARS else _EMPTY_KEYS[type(v)])
            if type(v) in _SCALARS or (type(v) in _EMPTY_KEYS and not v)
            else (k, _value_key(v, held))
            for k, v in vars(m).items()
            if k not in skip
        )
        modules.append((name, id(m), type(m), id(type(m).forward), m.training, attrs))
        held.append(m)
    tensors = tuple(_tensor_key(n, p, held) for n, p in model.named_parameters()) + tuple(
        _tensor_key(n, b, held) for n, b in model.named_buffers()
    )
    key = (tuple(modules), tensors, signature(x))
    return key, [o for o in held if o is not model]
