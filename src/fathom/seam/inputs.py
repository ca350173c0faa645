"""A model's inputs: a tensor, a tuple of tensors, or a mapping of tensors, one example per row.

Every instrument passes inputs ``x`` to the model as given: a tensor as ``model(x)``, a
tuple (or list) as ``model(*x)``, a mapping (HF style: ``input_ids``, ``attention_mask``) as
``model(**x)``. Every tensor in ``x`` has the leading example dimension, of the same size
``N``; other values (flags, ``None``) are passed unchanged to every slice. Slicing
(:func:`take`), counting (:func:`count`) and converting (:func:`convert`) go through this
module, so chunks of examples, the discovery batch and the float64 probe treat all three
structures alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from fathom.errors import FathomError

Inputs = torch.Tensor | tuple | list | Mapping


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, Mapping):
        return [v for v in x.values() if isinstance(v, torch.Tensor)]
    if isinstance(x, (tuple, list)):
        return [v for v in x if isinstance(v, torch.Tensor)]
    return []


def count(x: Any, what: str = "instruments") -> int:
    """``N``, the examples in ``x``; a :class:`FathomError` if ``x`` holds no tensor, a
    tensor without a leading example dimension, or tensors of different ``N``."""
    ts = _tensors(x)
    if not ts or any(t.dim() == 0 for t in ts) or ts[0].shape[0] == 0:
        raise FathomError(
            f"{what} need example inputs with a leading example dimension: a tensor, a tuple "
            f"of tensors (passed as model(*x)) or a dict of tensors (model(**x)); got "
            f"{_describe(x)}"
        )
    sizes = {int(t.shape[0]) for t in ts}
    if len(sizes) > 1:
        raise FathomError(
            f"the input tensors hold different numbers of examples {sorted(sizes)} in their "
            f"leading dimension ({_describe(x)}); every tensor needs one row per example"
        )
    return sizes.pop()


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {list(x.shape)}"
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (tuple, list)):
        return "(" + ", ".join(_describe(v) for v in x) + ")"
    return type(x).__name__


def convert(x: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``x`` with ``fn`` applied to each of its tensors (same structure)."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, Mapping):
        return type(x)({k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in x.items()})
    if isinstance(x, (tuple, list)):
        return type(x)(fn(v) if isinstance(v, torch.Tensor) else v for v in x)
    return x


def take(x: Any, index: Any) -> Any:
    """The examples ``index`` (a slice, an index tensor or list) of every tensor in ``x``."""
    return convert(x, lambda t: t[index])


def call(model: nn.Module, x: Any) -> Any:
    """``model(x)``, ``model(*x)`` or ``model(**x)`` (module docstring)."""
    if isinstance(x, Mapping):
        return model(**x)
    if isinstance(x, (tuple, list)):
        return model(*x)
    return model(x)


def signature(x: Any) -> tuple:
    """What a seam of a model depends on in its inputs besides ``N`` and the values: the
    structure, and each tensor's shape after the examples, dtype and device."""

    def one(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            return (tuple(t.shape[1:]), str(t.dtype), str(t.device))
        return repr(t)

    if isinstance(x, Mapping):
        return ("mapping", tuple((k, one(v)) for k, v in x.items()))
    if isinstance(x, (tuple, list)):
        return ("sequence", tuple(one(v) for v in x))
    return one(x)


def first_device(x: Any) -> torch.device:
    return _tensors(x)[0].device
