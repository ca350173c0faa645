"""Checks of a command's arguments that need no torch: refused in well under a second.

A command calls these first, before it imports torch (≈ 1.5-2 s of CPU) or reads data, so a
typo costs a user no more than Python's start-up: an output path that is an existing file, a
worker count below one, a directory that does not exist, ``--device cuda`` where this
torch cannot have a CUDA device (:func:`cuda_impossible`, read from the installed torch's
``version.py`` without importing it). Each refusal is a :class:`~fathom.errors.FathomError`
naming the problem and the fix. ``bench/bench_cli_startup.py`` times every one.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from fathom.errors import FathomError

_NO_CUDA = "device 'cuda' was requested but no CUDA device is available"
"""The head of every refusal of ``cuda`` (also :func:`fathom.base.provenance.resolve_device`'s)."""


def _torch_build_field(text: str, name: str) -> str | None:
    """The value written for ``name`` in torch's ``version.py`` (``cuda: Optional[str] = '12.4'``
    or ``cuda = None``): the right-hand side, stripped; ``None`` where the file has no such line."""
    m = re.search(rf"^{name}\b[^=\n]*=\s*(.+?)\s*$", text, re.M)
    return m[1] if m else None


def cuda_impossible() -> str | None:
    """Why no CUDA device can exist here (a sentence), or ``None`` where one may.

    Where torch is imported already, ``torch.cuda.is_available()`` decides. Otherwise the
    installed torch's ``version.py`` is read as text: a build with ``cuda = None`` and
    ``hip = None`` (a CPU-only build) has no CUDA device; on Linux, a CUDA build without the
    NVIDIA kernel driver (``/proc/driver/nvidia`` absent) has none either. Anything else
    (ROCm, other systems, a file this code cannot read) is left to torch: ``None``.
    """
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        return None if torch.cuda.is_available() else "torch finds none"
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version.read_text()
    except OSError:
        return None
    cuda, hip = _torch_build_field(text, "cuda"), _torch_build_field(text, "hip")
    if cuda == "None" and hip in (None, "None"):
        build = _torch_build_field(text, "__version__") or "?"
        return f"the installed torch {build.strip(chr(39) + chr(34))} is a CPU-only build"
    if cuda not in (None, "None") and hip in (None, "None") and sys.platform.startswith("linux"):
        if not Path("/proc/driver/nvidia").exists():
            return "no NVIDIA driver is loaded (/proc/driver/nvidia is absent)"
    return None


def check_device(name: str | None, flag: str = "--device") -> None:
    """Refuse ``cuda`` (or ``cuda:N``) where :func:`cuda_impossible` says none can exist."""
    if not name or not str(name).startswith("cuda"):
        return
    why = cuda_impossible()
    if why is not None:
        raise FathomError(f"{_NO_CUDA} ({why}); use {flag} auto or {flag} cpu")


def check_at_least_one(value: int | None, flag: str) -> None:
    """Refuse a count below one (``--workers 0``)."""
    if value is not None and value < 1:
        raise FathomError(f"{flag} must be at least 1, got {value}")


def check_output_dir(path: str | Path | None, flag: str = "--out") -> None:
    """Refuse an output directory that is an existing file (or lies under one)."""
    if path is None:
        return
    for p in (Path(path), *Path(path).parents):
        if p.exists():
            if not p.is_dir():
                raise FathomError(
                    f"{flag} {str(path)!r}: {str(p)!r} is a file, not a directory; give a "
                    f"directory (new or existing) for {flag}, or move the file away"
                )
            return


def check_exists(path: str | Path, what: str) -> None:
    """Refuse a path that does not exist: ``what`` says what to pass instead."""
    if not Path(path).exists():
        raise FathomError(f"{str(path)!r} does not exist; pass {what}")
