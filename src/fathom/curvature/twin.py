"""The float64 twin of a user's model and its seam, cached per model structure.

Every curvature call works on a float64 dense-evaluation copy of the model
(:func:`fathom.curvature.probe.float64_copy`) and needs that copy's seam
(:func:`fathom.seam.discover`: a few small forwards and, for generic layers, a self-check).
Both depend on the model's *structure* only, not on its parameter values, so
:func:`prepared` keeps them per model (weakly: they go when the model goes) and on a later
call only copies the current parameter and buffer values into the twin.

**Invalidation key**: :func:`fathom.seam.key.structure_key` (shared with
:class:`fathom.Instruments`); any difference rebuilds the twin and rediscovers the seam
(a module swapped, a mode toggled, an attribute, hook, parameter identity, dtype, device or
``requires_grad`` flag changed, a new probe shape). In-place value updates, e.g. an
optimizer step or new BatchNorm running statistics, are copied in. A branch mask or gain
left on the model is not part of the key: the twin is always in dense evaluation mode
(:func:`fathom.depth.enter_dense`, the function :func:`fathom.depth.dense_eval` uses).

What the key cannot see is state outside the model that its ``forward`` reads (a global,
a closure): such a model must call :func:`clear_twins` after changing it. Identities are
sound: the objects they name are kept alive beside the cached twin (the model itself
excepted), so none can be freed and its address reused by a different object. A model whose
hooks or attributes hold a reference to the model itself stays cached until
:func:`clear_twins` (the twin shares those hooks).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from fathom.curvature.probe import float64_copy, probe_inputs
from fathom.errors import FathomError
from fathom.losses.kinds import Loss
from fathom.losses.layout import Selector
from fathom.seam import Seam, discover
from fathom.seam.inputs import count
from fathom.seam.key import structure_key

_TWINS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, list, nn.Module, Seam]] = (
    weakref.WeakKeyDictionary()
)


def prepared(
    model: nn.Module, x, *, output: Selector = None, loss: Loss | None = None
) -> tuple[nn.Module, torch.Tensor, Seam]:
    """``(model64, x64, seam)``: the float64 dense-evaluation twin holding ``model``'s current
    values, the probe inputs on its device (floating inputs in float64) and its seam
    (discovered reading the output ``output`` with ``loss``: :func:`fathom.seam.discover`)."""
    try:
        valid = isinstance(model, nn.Module) and count(x) > 0
    except FathomError:
        valid = False
    key, held = structure_key(model, x) if valid else (None, [])  # else the refusals below
    if key is not None:
        key = (*key, repr(output))
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
    seam = discover(twin, x64, output=output, loss=loss)
    if key is not None:
        _TWINS[model] = (key, held, twin, seam)
    return twin, x64, seam


def clear_twins() -> None:
    """Forget every cached twin (needed only when a model's forward reads outside state)."""
    _TWINS.clear()
