"""Weights as safetensors (hash in metadata, checked on load) and the resume state."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fathom.errors import FathomError
from fathom.io import atomic_write_bytes, state_dict_digest

EXTRA_STATE_SUFFIX = "_extra_state"
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
        if not k.endswith(EXTRA_STATE_SUFFIX)
    }


def load_cpu_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`cpu_state`: every parameter and buffer must be present and match.

    Extra state absent from ``state`` keeps the model's current one (a weights file holds
    none); anything else missing or unexpected is refused. (A dict read from safetensors has
    no ``_metadata`` versions, so torch's BatchNorm inserts a ``num_batches_tracked`` key of
    its own even where the model dropped that buffer; such keys, absent from ``state``, are
    not the checkpoint's and are ignored.)
    """
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(EXTRA_STATE_SUFFIX)]
    unexpected = [k for k in result.unexpected_keys if k in state]
    if missing or unexpected:
        raise FathomError(
            f"weights do not fit {type(model).__name__}: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; the checkpoint belongs to another model or config"
        )


def save_weights(path: Path, state: dict[str, torch.Tensor], metadata: dict[str, Any]) -> str:
    """Write ``state`` atomically; metadata gains ``params_sha256``. Returns that digest."""
    digest = state_dict_digest(state)
    meta = {k: str(v) for k, v in metadata.items()}
    meta["params_sha256"] = digest
    atomic_write_bytes(path, st_save(state, metadata=meta))
    return digest


def load_weights(
    path: Path, expected_sha256: str | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Load and verify a checkpoint: the stored digest must match the tensors (and ``expected``)."""
    path = Path(path)
    if not path.exists():
        raise FathomError(f"checkpoint {str(path)!r} does not exist")
    data = path.read_bytes()
    try:
        state = st_load(data)
        from safetensors import safe_open  # metadata reader

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, ValueError, OSError) as e:
        raise FathomError(
            f"checkpoint {str(path)!r} is corrupt ({e}); retrain or restore it"
        ) from None
    actual = state_dict_digest(state)
    stored = meta.get("params_sha256")
    if stored != actual or (expected_sha256 is not None and expected_sha256 != actual):
        raise FathomError(
            f"checkpoint {str(path)!r} fails its hash check: expected "
            f"{expected_sha256 or stored}, tensors hash to {actual}. The file was modified or "
            "corrupted; restore it from the original run directory or retrain."
        )
    return state, meta


def save_resume(path: Path, state: dict[str, Any]) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_resume(path: Path) -> dict[str, Any]:
    if not Path(path).exists():
        raise FathomError(
            f"no resume state at {str(path)!r}: the run was interrupted before its first "
            "epoch boundary; start it again without --resume (after removing the directory)"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises many types for a corrupt pickle/zip
        raise FathomError(
            f"resume state {str(path)!r} is corrupt ({type(e).__name__}: {e}); "
            "remove the run directory and train again"
        ) from None
