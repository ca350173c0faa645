"""The files of a run directory, each carrying a digest that is checked on read.

* weights: safetensors, metadata ``params_sha256`` = :func:`fathom.base.io.state_dict_digest`
  of the tensors; the manifest's entry also records ``sha256``, the digest of the whole
  file (header and metadata included), so a flipped byte anywhere is detected;
* resume state: ``checkpoints/resume.safetensors`` (:func:`encode_resume`), tensors in
  safetensors and everything else in JSON in its metadata (:func:`encode_state`, inverted
  exactly by :func:`decode_state`), with the digest of both, so a
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
import json
import math
import re
from collections.abc import Mapping
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

_RESUME_CONTAINER = "fathom-resume-1"
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
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    return dict(header.get("__metadata__") or {})


# -- the resume state's encoding: a nested state as tensors plus JSON, without pickle -----
_TAGS = ("$tensor", "$tuple", "$float", "$dict")


def encode_state(state: Any) -> tuple[dict[str, torch.Tensor], str]:
    """``(tensors, json_text)`` of ``state``: what a resume state is on disk, without pickle.

    A state (dicts, lists, tuples, ``None``, bools, ints, floats, strings and tensors, nested
    in any way: a model's and an optimizer's ``state_dict``, RNG states, clocks, counters) is
    split into

    * the tensors, named ``t0``, ``t1``, ... in the order a depth-first walk meets them, each
      detached, on the host and contiguous (a copy, so no two share storage);
    * a JSON text of everything else, compact, keys in their insertion order (the order is part
      of the state: a dict written back to a history row keeps its key order), where a tensor
      is ``{"$tensor": i}``. Values JSON has no form for are tagged by one key starting with
      ``$``: ``{"$tuple": [...]}``, ``{"$float": "nan" | "inf" | "-inf"}``, and
      ``{"$dict": [[key, value], ...]}`` for a dict with a non-string key (an optimizer's
      parameter indices) or a key starting with ``$``.

    :func:`decode_state` inverts it exactly: ``decode_state(*encode_state(s))`` equals ``s``
    value for value and type for type (a mapping comes back as a ``dict``, a tuple subclass
    such as ``torch.Size`` as a ``tuple``). Nothing is imported or called by name while
    decoding: the JSON can only describe the types above. A value of any other type is refused
    when encoding, naming where it is in the state.
    """
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors, "state")
    return tensors, json.dumps(tree, separators=(",", ":"), allow_nan=False)


def decode_state(tensors: Mapping[str, torch.Tensor], text: str) -> Any:
    """Inverse of :func:`encode_state`; a malformed text or a missing tensor is a
    ``ValueError`` (the caller names the file)."""
    tree = json.loads(text, parse_constant=_no_constant)
    used: set[str] = set()
    out = _decode(tree, tensors, used)
    if used != set(tensors):
        raise ValueError(f"tensors {sorted(set(tensors) - used)[:5]} are not part of the state")
    return out


def _encode(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {"$float": repr(float(value))}
    if isinstance(value, torch.Tensor):
        return {"$tensor": _add_tensor(value, tensors, where)}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else {"$tuple": items}
    if isinstance(value, Mapping):
        plain = all(isinstance(k, str) and not k.startswith("$") for k in value)
        if plain:
            return {k: _encode(v, tensors, f"{where}[{k!r}]") for k, v in value.items()}
        return {
            "$dict": [
                [_encode(k, tensors, f"{where} key {k!r}"), _encode(v, tensors, f"{where}[{k!r}]")]
                for k, v in value.items()
            ]
        }
    raise FathomError(
        f"the resume state holds a {type(value).__module__}.{type(value).__qualname__} at "
        f"{where}; a resume state holds only tensors, numbers, strings, None, lists, tuples "
        "and dicts (it is stored as safetensors + JSON, never pickled). Make that "
        "state_dict() return one of these (e.g. a tensor or a list of numbers)"
    )


def _add_tensor(value: torch.Tensor, tensors: dict[str, torch.Tensor], where: str) -> int:
    if value.is_complex() or value.is_quantized or value.is_sparse:
        raise FathomError(
            f"the resume state holds a {value.dtype} {value.layout} tensor at {where}, which "
            "safetensors cannot store; keep it as a dense real tensor (e.g. torch.view_as_real)"
        )
    i = len(tensors)
    tensors[f"t{i}"] = value.detach().to("cpu", copy=True).contiguous()
    return i


def _decode(node: Any, tensors: Mapping[str, torch.Tensor], used: set[str]) -> Any:
    if isinstance(node, list):
        return [_decode(v, tensors, used) for v in node]
    if not isinstance(node, dict):
        return node  # None, bool, int, float, str: JSON's own
    tag = [k for k in node if k.startswith("$")]
    if not tag:
        return {k: _decode(v, tensors, used) for k, v in node.items()}
    if len(node) != 1 or tag[0] not in _TAGS:
        raise ValueError(f"unknown or mixed tag {sorted(node)[:3]}")
    key, body = tag[0], node[tag[0]]
    if key == "$tensor":
        name = f"t{body}"
        if type(body) is not int or name not in tensors or name in used:
            raise ValueError(f"tensor reference {body!r} is missing or repeated")
        used.add(name)
        return tensors[name]
    if key == "$tuple":
        return tuple(_decode(v, tensors, used) for v in _list(body))
    if key == "$float":
        if body not in ("nan", "inf", "-inf"):
            raise ValueError(f"non-finite float {body!r} is not nan, inf or -inf")
        return float(body)
    pairs = [_decode(p, tensors, used) for p in _list(body)]
    if any(not isinstance(p, list) or len(p) != 2 for p in pairs):
        raise ValueError("a tagged dict is not a list of [key, value] pairs")
    return {k: v for k, v in pairs}


def _list(body: Any) -> list[Any]:
    if not isinstance(body, list):
        raise ValueError(f"a tagged value holds {type(body).__name__}, not a list")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"JSON constant {name} (non-finite floats are tagged)")


def encode_resume(state: dict[str, Any]) -> bytes:
    """The bytes of ``checkpoints/resume.safetensors`` for ``state``: a safetensors file of
    the state's tensors (:func:`encode_state`) whose metadata holds
    ``format`` (:data:`_RESUME_CONTAINER`), ``state`` (the JSON of everything else) and
    ``state_sha256`` (:func:`_resume_digest`), header written by :func:`canonical_header`."""
    tensors, text = encode_state(state)
    meta = {
        "format": _RESUME_CONTAINER,
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
        if meta.get("format") != _RESUME_CONTAINER:
            raise ValueError(f"format {meta.get('format')!r}, not {_RESUME_CONTAINER!r}")
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
