"""The float64 twin of a user's model and its seam, cached per model structure.

Every curvature call works on a float64 dense-evaluation copy of the model
(:func:`fathom.curvature.probe.float64_copy`) and needs that copy's seam
(:func:`fathom.seam.discover`: a few small forwards and, for generic layers, a self-check).
Both depend on the model's *structure* only, not on its parameter values, so
:func:`prepared` keeps them per model (weakly: they go when the model goes) and on a later
call only copies the current parameter and buffer values into the twin.

**Invalidation key** (:func:`structure_key`); any difference rebuilds the twin and
rediscovers the seam:

* every module (``named_modules``, duplicates kept): its qualified name, object identity,
  class and the class's ``forward``, its ``training`` flag, and every other attribute of
  its ``__dict__`` (numbers, strings, tuples by value, hooks by identity, tensors that are
  not parameters or buffers by identity and in-place version, anything else by type and
  identity) — a module swapped, ``train()`` / ``eval()`` toggled, a stride or ``eps`` or a
  custom flag changed, a hook or an instance-level ``forward`` added;
* every parameter and buffer: name, identity, shape, dtype, device (so ``.double()``,
  ``.to(device)`` or a replaced tensor rebuild; in-place value updates, e.g. an optimizer
  step or new BatchNorm running statistics, are copied in);
* the probe inputs' per-example shape, dtype and device.

What the key cannot see is state outside the model that its ``forward`` reads (a global,
a closure): such a model must call :func:`clear_twins` after changing it. Identities are
sound: the objects they name are kept alive beside the cached twin (the model itself
excepted), so none can be freed and its address reused by a different object. A model whose
hooks or attributes hold a reference to the model itself stays cached until
:func:`clear_twins` (the twin shares those hooks).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from fathom.curvature.probe import float64_copy, probe_inputs
from fathom.seam import Seam, discover

_TWINS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, list, nn.Module, Seam]] = (
    weakref.WeakKeyDictionary()
)
_OWN = frozenset({"_parameters", "_buffers", "_modules", "training"})


def _value_key(v: Any, held: list, depth: int = 0) -> Any:
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return v
    if depth < 3 and isinstance(v, (tuple, list, set, frozenset)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return (type(v).__name__, tuple(_value_key(e, held, depth + 1) for e in items))
    if depth < 3 and isinstance(v, dict):
        return ("dict", tuple((repr(k), _value_key(e, held, depth + 1)) for k, e in v.items()))
    held.append(v)
    if isinstance(v, torch.Tensor):
        return ("tensor", id(v), v._version, tuple(v.shape), str(v.dtype), str(v.device))
    return (type(v).__qualname__, id(v))


def _tensor_key(name: str, t: torch.Tensor | None, held: list) -> tuple:
    if t is None:
        return (name, None)
    held.append(t)
    return (name, id(t), tuple(t.shape), str(t.dtype), str(t.device))


def structure_key(model: nn.Module, x: torch.Tensor) -> tuple[tuple, list]:
    """``(key, held)``: everything the twin and its seam depend on besides parameter and
    buffer values, and the objects whose identities the key holds (kept alive beside the
    cached twin, the model itself excepted, so that no identity can be reused meanwhile)."""
    held: list = []
    modules = []
    for name, m in model.named_modules(remove_duplicate=False):
        attrs = tuple((k, _value_key(v, held)) for k, v in vars(m).items() if k not in _OWN)
        modules.append((name, id(m), type(m), id(type(m).forward), m.training, attrs))
        held.append(m)
    tensors = tuple(_tensor_key(n, p, held) for n, p in model.named_parameters()) + tuple(
        _tensor_key(n, b, held) for n, b in model.named_buffers()
    )
    key = (tuple(modules), tensors, (tuple(x.shape[1:]), str(x.dtype), str(x.device)))
    return key, [o for o in held if o is not model]


def prepared(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, Seam]:
    """``(model64, x64, seam)``: the float64 dense-evaluation twin holding ``model``'s current
    values, the probe inputs on its device (floating inputs in float64) and its seam."""
    valid = isinstance(model, nn.Module) and isinstance(x, torch.Tensor) and x.dim() > 0
    key, held = structure_key(model, x) if valid else (None, [])  # else the refusals below
    hit = _TWINS.get(model) if key is not None else None
    if hit is not None and hit[0] == key:
        twin, seam = hit[2], hit[3]
        with torch.no_grad():
            pairs = zip(model.parameters(), twin.parameters(), strict=True)
            for src, dst in (*pairs, *zip(model.buffers(), twin.buffers(), strict=True)):
                dst.copy_(src)
        return twin, probe_inputs(twin, x), seam
    twin = float64_copy(model)
    x64 = probe_inputs(twin, x)
    seam = discover(twin, x64)
    if key is not None:
        _TWINS[model] = (key, held, twin, seam)
    return twin, x64, seam


def clear_twins() -> None:
    """Forget every cached twin (needed only when a model's forward reads outside state)."""
    _TWINS.clear()
