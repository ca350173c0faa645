"""The files of a run directory, each carrying a digest that is checked on read.

* weights: safetensors, metadata ``params_sha256`` = :func:`fathom.base.io.state_dict_digest`
  of the tensors; the manifest's entry also records ``sha256``, the digest of the whole
  file (header and metadata included), so a flipped byte anywhere is detected;
* resume state: ``checkpoints/resume.safetensors`` (:func:`encode_resume`), tensors in
  safetensors and everything else in JSON in its metadata, with the digest of both, so a
  flipped byte is detected even when the manifest was not yet rewritten after the state
  was (a kill in between). Nothing is unpickled: a ``resume.pt`` of an older fathom is read
  by torch's weights-only unpickler or refused (:func:`load_legacy_resume`);
* JSON files: see :mod:`fathom.rundir.manifest` (manifest digest) and the history digest.

Every write is atomic (:func:`fathom.base.io.atomic_write_bytes`); a kill leaves at most a
``.*.tmp`` file, which :func:`stray_tmp_files` finds and the next writer removes.
"""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fathom.base.io import atomic_write_bytes, sha256_bytes, state_dict_digest
from fathom.errors import FathomError
from fathom.rundir.filecheck import (  # noqa: F401  (re-exported)
    LEGACY_RESUME,
    RESUME_NAME,
    check_run_dir,
    refuse_links_out,
    resume_file,
    stray_tmp_files,
)
from fathom.rundir.statecodec import decode_state, encode_state

RESUME_CONTAINER = "fathom-resume-1"
"""``format`` in the resume state's safetensors metadata."""
RESUME_MAGIC = b"FATHOM-RESUME-1\n"
"""The header of a :data:`LEGACY_RESUME` file."""


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


def encode_resume(state: dict[str, Any]) -> bytes:
    """The bytes of ``checkpoints/resume.safetensors`` for ``state``: a safetensors file of
    the state's tensors (:func:`fathom.rundir.statecodec.encode_state`) whose metadata holds
    ``format`` (:data:`RESUME_CONTAINER`), ``state`` (the JSON of everything else) and
    ``state_sha256`` (:func:`_resume_digest`), header written by :func:`canonical_header`."""
    tensors, text = encode_state(state)
    meta = {
        "format": RESUME_CONTAINER,
        "state": text,
        "state_sha256": _resume_digest(tensors, text),
    }
    return canonical_header(st_save(tensors, metadata=meta))


def _resume_digest(tensors: dict[str, torch.Tensor], text: str) -> str:
    """``sha256(state JSON + "\n" + state_dict_digest(tensors))``."""
    return sha256_bytes(text.encode() + b"\n" + state_dict_digest(tensors).encode())


def save_resume(path: Path, state: dict[str, Any]) -> str:
    """Write the resume state atomically (:func:`encode_resume`); return its ``state_sha256``."""
    data = encode_resume(state)
    atomic_write_bytes(path, data)
    return _safetensors_metadata(data)["state_sha256"]


def load_resume(path: Path) -> dict[str, Any]:
    """The verified resume state at ``path``; a flipped byte anywhere is a clear error.

    ``resume.safetensors``: tensors and JSON only, their digest checked, the header written
    as :func:`canonical_header` writes it (safetensors itself checks that the tensors' bytes
    follow it without a gap), so no byte of the file goes unchecked. A ``resume.pt`` of
    an older fathom goes to :func:`load_legacy_resume`.
    """
    path = Path(path)
    if not path.exists():
        raise FathomError(
            f"no resume state at {str(path)!r}: the run was interrupted before its first "
            "epoch boundary; start it again without --resume (after removing the directory)"
        )
    if path.name == LEGACY_RESUME:
        return load_legacy_resume(path)
    data = path.read_bytes()
    try:
        tensors = st_load(data)
        meta = _safetensors_metadata(data)
        text = meta.get("state", "")
        if meta.get("format") != RESUME_CONTAINER:
            raise ValueError(f"format {meta.get('format')!r}, not {RESUME_CONTAINER!r}")
        actual = _resume_digest(tensors, text)
        if actual != meta.get("state_sha256"):
            raise ValueError(
                f"it fails its digest check (recorded {meta.get('state_sha256')}, content "
                f"hashes to {actual})"
            )
        state = decode_state(tensors, text)
        head = data[: 8 + int.from_bytes(data[:8], "little")]
        if canonical_header(head) != head:
            raise ValueError("its header is not written the way this fathom writes it")
    except (SafetensorError, ValueError, TypeError, KeyError, RecursionError, FathomError) as e:
        raise FathomError(
            f"resume state {str(path)!r} is corrupt ({e}): resuming would continue from wrong "
            "state. Restore the run directory from a copy, or remove it and train again"
        ) from None
    return state


def load_legacy_resume(path: Path) -> dict[str, Any]:
    """A ``resume.pt`` of an older fathom (``MAGIC + sha256 + "\\n" + torch.save`` payload),
    verified, then read by torch's weights-only unpickler (tensors and plain containers
    only: no other class is built and nothing is called); anything else is refused by name.
    :meth:`fathom.rundir.writer.RunWriter.resume_state` converts what it reads."""
    data = Path(path).read_bytes()
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
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a refused global or a corrupt zip
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        why = f"it calls or builds {found.group(1)}" if found else type(e).__name__
        raise FathomError(
            f"resume state {str(path)!r} (the pickle format of an older fathom) is refused: "
            f"torch's weights-only unpickler will not read it ({why}). It holds more than "
            "tensors and plain values (possibly code to run), and nothing in a run directory "
            "is unpickled beyond that. Restore the run directory from a copy you trust, or "
            "move it away and train the run again"
        ) from None
    if not isinstance(state, dict):
        raise FathomError(
            f"resume state {str(path)!r} holds a {type(state).__name__}, not a resume state; "
            "move the run directory away and train the run again"
        )
    return state


def convert_legacy(run_dir: Path) -> dict[str, str] | None:
    """When the resume state of ``run_dir`` is an older fathom's ``resume.pt``: write it
    (verified again, :func:`load_legacy_resume`) as ``checkpoints/resume.safetensors``, remove
    ``resume.pt`` and return the recovery event's details ``{"old", "new"}``; else ``None``."""
    found = resume_file(run_dir)
    if found is None or found.name != LEGACY_RESUME:
        return None
    save_resume(found.with_name(RESUME_NAME), load_legacy_resume(found))
    found.unlink()
    return {"old": f"checkpoints/{LEGACY_RESUME}", "new": f"checkpoints/{RESUME_NAME}"}
