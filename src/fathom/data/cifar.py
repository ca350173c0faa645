"""CIFAR-10 / CIFAR-100 from the official "python version" archives.

Each batch in the archive is a pickled dict with ``b"data"``: uint8 ``[n, 3072]`` (the
1024 red, then green, then blue values of each 32x32 image, row-major) and the labels
(``b"labels"`` for CIFAR-10, ``b"fine_labels"`` for CIFAR-100). Members are read
straight from the tar stream (nothing is extracted), after the archive's checksums have
been verified, and unpickled by an unpickler that only rebuilds numpy arrays.
"""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fathom.data.registry import CifarDataset
from fathom.errors import FathomError

_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # bytes pickled by Python 3 at protocol 2
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickle plain containers and numpy arrays only; any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        if module == "numpy.core.multiarray":
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


def _unpickle_batch(data: bytes, name: str) -> dict[bytes, Any]:
    try:
        batch = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    except Exception as e:
        raise FathomError(f"{name}: unreadable CIFAR batch ({e}).") from None
    if not isinstance(batch, dict):
        raise FathomError(f"{name}: a CIFAR batch must be a dict, got {type(batch).__name__}.")
    return batch


def _batch_arrays(
    batch: dict[bytes, Any], label_key: str, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images uint8 [n, 3, 32, 32], labels int64 [n])`` of one batch."""
    key = label_key.encode()
    if b"data" not in batch or key not in batch:
        raise FathomError(f"{name}: CIFAR batch lacks b'data' or b'{label_key}'.")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise FathomError(
            f"{name}: CIFAR data must be uint8 [n, 3072], got {data.dtype} {data.shape}."
        )
    if labels.shape != (data.shape[0],):
        raise FathomError(f"{name}: {labels.shape[0]} labels for {data.shape[0]} images.")
    images = torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
    return images, torch.from_numpy(labels.copy())


def read_cifar_archive(path: Path, spec: CifarDataset) -> dict[str, torch.Tensor]:
    """Read the train and test splits of a (verified) CIFAR archive.

    Returns ``train_x, train_y, test_x, test_y``; sizes and label ranges are checked
    against ``spec``.
    """
    out: dict[str, torch.Tensor] = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for split, members, size in (
                ("train", spec.train_members, spec.train_size),
                ("test", spec.test_members, spec.test_size),
            ):
                xs, ys = [], []
                for member in members:
                    try:
                        handle = tar.extractfile(member)
                    except KeyError:
                        handle = None
                    if handle is None:
                        raise FathomError(
                            f"{path}: member {member} missing; this is not the official "
                            f"{spec.title} python-version archive ({spec.url})."
                        )
                    x, y = _batch_arrays(
                        _unpickle_batch(handle.read(), f"{path}:{member}"),
                        spec.label_key,
                        f"{path}:{member}",
                    )
                    xs.append(x)
                    ys.append(y)
                x, y = torch.cat(xs), torch.cat(ys)
                if x.shape[0] != size:
                    raise FathomError(
                        f"{path}: {split} split has {x.shape[0]} images, expected {size}."
                    )
                if y.numel() and (int(y.min()) < 0 or int(y.max()) >= spec.classes):
                    raise FathomError(f"{path}: {split} labels outside [0, {spec.classes}).")
                out[f"{split}_x"], out[f"{split}_y"] = x, y
    except (tarfile.TarError, OSError, EOFError) as e:
        raise FathomError(
            f"{path}: unreadable archive ({e}). Download it again from {spec.url}."
        ) from None
    return out
