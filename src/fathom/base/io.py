"""Atomic file writes and content hashes shared by every package.

A crash never leaves a half-written file that a reader would accept: every write
goes to a temporary file in the same directory, is fsync'ed, then renamed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fathom.base.interrupts import uninterrupted
from fathom.errors import os_error

if TYPE_CHECKING:
    import torch


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename, fsync dir).

    Ctrl-C (and SIGTERM under :func:`~fathom.base.interrupts.sigterm_interrupts`) is held
    back until the write is done (:func:`~fathom.base.interrupts.uninterrupted`): an
    interrupt inside ``mkstemp``, after it created the file and before it returned the name,
    would otherwise leave a ``.*.tmp`` file that no ``except`` here could name. Only a kill
    leaves one (``tests/test_atomic_interrupt.py``).
    """
    path = Path(path)
    with uninterrupted():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual file mode
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def json_safe(value: Any) -> Any:
    """Map non-finite floats to ``None`` (JSON has no NaN); recurse into containers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def dumps(obj: Any, *, indent: int | None = None) -> str:
    """Strict JSON: non-finite floats become null, never ``NaN``."""
    return json.dumps(json_safe(obj), indent=indent, sort_keys=indent is not None, allow_nan=False)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, (dumps(obj, indent=2) + "\n").encode())


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def read_jsonl(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[int]]:
    """Read complete JSON lines; return ``(rows, bad_line_numbers)``.

    A line that is not terminated by a newline, is not UTF-8, does not parse or is not a
    JSON object is a truncated or damaged write: it is reported, never accepted.
    """
    return parse_jsonl(Path(path).read_bytes() if Path(path).exists() else b"")


def parse_jsonl(data: bytes) -> tuple[list[Any], list[int]]:
    """The complete JSON lines of ``data`` and the (1-based) numbers of torn ones
    (unterminated, not UTF-8, not JSON or not an object; see :func:`read_jsonl`)."""
    rows: list[Any] = []
    bad: list[int] = []
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]
    for i, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            bad.append(i)
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad.append(i)
    if tail.strip():
        bad.append(len(complete) + 1)
    return rows, bad


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over names, dtypes, shapes and raw bytes of tensors, in the given order."""
    import torch

    h = hashlib.sha256()
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def state_dict_digest(state: Mapping[str, torch.Tensor]) -> str:
    """Digest of a state dict, keys sorted: equal digests mean byte-identical weights."""
    return tensor_digest(sorted(state.items()))


def config_digest(obj: Any) -> str:
    """Hash of a JSON-serialisable config (canonical: sorted keys, no whitespace)."""
    return sha256_bytes(json.dumps(json_safe(obj), sort_keys=True, separators=(",", ":")).encode())


def ensure_writable_dir(path: str | os.PathLike, where: str = "--out") -> Path:
    """Create ``path`` and prove it is writable, or raise a clear error (``where``: the
    option that chooses another location)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as e:
        raise os_error(e, f"write to directory {str(path)!r}", where) from None
    return path


RUN_LOCK, STUDY_LOCK = ".fathom-run.lock", ".fathom-study.lock"
"""The lock files of a run directory and of a study directory (:mod:`fathom.rundir.lock`)."""


def fathom_tree(path: str | os.PathLike) -> Path | None:
    """The nearest run or study directory at or above ``path`` (resolved), else ``None``.

    A run directory holds its lock (:data:`RUN_LOCK`) or ``manifest.json`` with
    ``history.jsonl``; a study directory holds :data:`STUDY_LOCK`.
    """
    where = Path(path).resolve()
    for d in (where, *where.parents):
        run = (d / "manifest.json").is_file() and (d / "history.jsonl").exists()
        if run or (d / RUN_LOCK).exists() or (d / STUDY_LOCK).exists():
            return d
    return None
