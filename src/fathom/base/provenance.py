"""Provenance recorded in every manifest: source hash and environment."""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch


@lru_cache(maxsize=1)
def source_hash() -> str:
    """SHA-256 over the relative paths and bytes of every ``.py`` file of the package."""
    root = Path(__file__).resolve().parents[1]  # src/fathom (this file is fathom/base/...)
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from fathom.errors import FathomError

        raise FathomError(
            "device 'cuda' was requested but no CUDA device is available; use 'auto' or 'cpu'"
        )
    return torch.device(name)


def environment(device: torch.device) -> dict:
    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "dtype": "float32",
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
    }
    return env
