"""The files of a run directory, each carrying a digest that is checked on read.

* weights: safetensors, metadata ``params_sha256`` = :func:`fathom.base.io.state_dict_digest`
  of the tensors; the manifest's entry also records ``sha256``, the digest of the whole
  file (header and metadata included), so a flipped byte anywhere is detected;
* resume state: a self-verifying container ``MAGIC + sha256(payload) hex + "\\n" + payload``
  (payload: ``torch.save`` of the state), so a flipped byte is detected before unpickling,
  even when the manifest was not yet rewritten after the state was (a kill in between);
* JSON files: see :mod:`fathom.rundir.manifest` (manifest digest) and the history digest.

Every write is atomic (:func:`fathom.base.io.atomic_write_bytes`); a kill leaves at most a
``.*.tmp`` file, which :func:`stray_tmp_files` finds and the next writer removes.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fathom.base.io import atomic_write_bytes, sha256_bytes, state_dict_digest
from fathom.errors import FathomError
from fathom.rundir.filecheck import stray_tmp_files  # noqa: F401  (re-exported)

RESUME_MAGIC = b"FATHOM-RESUME-1\n"


def encode_weights(state: dict[str, torch.Tensor], metadata: dict[str, Any]) -> tuple[bytes, str]:
    """Safetensors bytes of ``state`` (metadata gains ``params_sha256``) and that digest.

    The bytes are a function of ``state`` and ``metadata`` alone (:func:`canonical_header`):
    identical runs write identical files, so recorded file digests reproduce.
    """
    digest = state_dict_digest(state)
    meta = {k: str(v) for k, v in metadata.items()}
    meta["params_sha256"] = digest
    return canonical_header(st_save(state, metadata=meta)), digest


def canonical_header(data: bytes) -> bytes:
    """``data`` (a safetensors blob) with its JSON header written deterministically.

    safetensors serializes ``__metadata__`` from a hash map whose order changes from one
    process to the next; the tensor bytes and their offsets are deterministic. The header is
    rewritten as compact JSON: ``__metadata__`` first with sorted keys, then the tensors in
    the order of their offsets, padded with spaces to a multiple of 8 bytes (the format's
    alignment), preceded by its 8-byte little-endian length.
    """
    import json

    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    ordered: dict[str, Any] = {}
    if meta is not None:
        ordered["__metadata__"] = dict(sorted(meta.items()))
    for name in sorted(header, key=lambda k: (header[k]["data_offsets"], k)):
        ordered[name] = header[name]
    text = json.dumps(ordered, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + n :]


def save_weights(path: Path, state: dict[str, torch.Tensor], metadata: dict[str, Any]) -> str:
    """Write ``state`` atomically; return its ``params_sha256``."""
    data, digest = encode_weights(state, metadata)
    atomic_write_bytes(path, data)
    return digest


def load_weights(
    path: Path, expected_sha256: str | None = None, expected_file_sha256: str | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Load and verify weights: file digest (when recorded), stored and expected tensor digest."""
    path = Path(path)
    if not path.exists():
        raise FathomError(f"checkpoint {str(path)!r} does not exist; restore it or retrain")
    data = path.read_bytes()
    if expected_file_sha256 is not None and sha256_bytes(data) != expected_file_sha256:
        raise FathomError(
            f"checkpoint {str(path)!r} fails its hash check (file digest recorded "
            f"{expected_file_sha256}, file hashes to {sha256_bytes(data)}): the file was "
            "modified or corrupted; restore it from the original run directory or retrain"
        )
    try:
        state = st_load(data)
        meta = _safetensors_metadata(data)
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


def _safetensors_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob (8-byte little-endian header length + JSON)."""
    import json

    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    return dict(header.get("__metadata__") or {})


def save_resume(path: Path, state: dict[str, Any]) -> str:
    """Write the resume state as a self-verifying container; return the payload digest."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    atomic_write_bytes(path, RESUME_MAGIC + digest.encode() + b"\n" + payload)
    return digest


def load_resume(path: Path) -> dict[str, Any]:
    """The verified resume state at ``path``; a flipped byte anywhere is a clear error."""
    path = Path(path)
    if not path.exists():
        raise FathomError(
            f"no resume state at {str(path)!r}: the run was interrupted before its first "
            "epoch boundary; start it again without --resume (after removing the directory)"
        )
    data = path.read_bytes()
    head = len(RESUME_MAGIC)
    if not data.startswith(RESUME_MAGIC) or data[head + 64 : head + 65] != b"\n":
        raise FathomError(
            f"resume state {str(path)!r} is corrupt (no fathom resume header: truncated, "
            "overwritten or written by another tool); remove the run directory and train again"
        )
    recorded = data[head : head + 64].decode(errors="replace")
    payload = data[head + 65 :]
    actual = hashlib.sha256(payload).hexdigest()
    if actual != recorded:
        raise FathomError(
            f"resume state {str(path)!r} is corrupt: it fails its digest check (recorded "
            f"{recorded}, content hashes to {actual}); resuming would continue from wrong "
            "weights. Remove the run directory and train again"
        )
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises many types for a corrupt pickle/zip
        raise FathomError(
            f"resume state {str(path)!r} is corrupt ({type(e).__name__}: {e}); "
            "remove the run directory and train again"
        ) from None
