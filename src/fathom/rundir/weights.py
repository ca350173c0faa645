"""What a weights file holds: a model's parameters and persistent buffers, on the host.

:func:`cpu_state` is the tensor dict that checkpoints store and ``params_sha256`` digests
(:func:`fathom.base.io.state_dict_digest`) cover; :func:`load_cpu_state` puts one back.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from fathom.errors import FathomError

_EXTRA_STATE_SUFFIX = "_extra_state"
"""torch's key suffix for a module's ``get_extra_state()`` (e.g. a branch's generator state)."""


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers on the host: the weights that checkpoints and hashes cover.

    Modules' extra state (``*._extra_state``, e.g. the generator of a self-sampling
    :class:`fathom.depth.SkippableResidual`) is left out, so weights files and
    ``params_sha256`` digests are those of the tensors alone.
    """
    return {
        k: v.detach().to("cpu").contiguous().clone()
        for k, v in model.state_dict().items()
        if not k.endswith(_EXTRA_STATE_SUFFIX)
    }


def extra_state(model: torch.nn.Module) -> dict[str, Any]:
    """The modules' extra state (``*._extra_state``) that :func:`cpu_state` leaves out, on the
    host: e.g. each self-sampling branch's generator state. The resume state carries it, so
    a resumed run draws the same decisions; weights files and their digests do not."""
    return {
        k: v.detach().to("cpu").clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
        for k, v in model.state_dict().items()
        if k.endswith(_EXTRA_STATE_SUFFIX)
    }


def load_extra_state(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """Inverse of :func:`extra_state`: every key must be one of the model's extra states."""
    mine = {k for k in model.state_dict() if k.endswith(_EXTRA_STATE_SUFFIX)}
    if set(state) != mine:
        raise FathomError(
            f"the resume state's module extra state {sorted(state)[:5]} does not fit "
            f"{type(model).__name__} (extra state {sorted(mine)[:5]}); it belongs to another model"
        )
    model.load_state_dict(state, strict=False)


def load_cpu_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`cpu_state`: every parameter and buffer must be present and match.

    Extra state absent from ``state`` keeps the model's current one (a weights file holds
    none); anything else missing or unexpected is refused. (A dict read from safetensors has
    no ``_metadata`` versions, so torch's BatchNorm inserts a ``num_batches_tracked`` key of
    its own even where the model dropped that buffer; such keys, absent from ``state``, are
    not the checkpoint's and are ignored.)
    """
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(_EXTRA_STATE_SUFFIX)]
    unexpected = [k for k in result.unexpected_keys if k in state]
    if missing or unexpected:
        raise FathomError(
            f"weights do not fit {type(model).__name__}: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; the checkpoint belongs to another model or config"
        )
