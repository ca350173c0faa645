"""``load_raw``: a dataset's official train and test sets as verified uint8 tensors."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from fathom.data.cifar import read_cifar_archive
from fathom.data.idx import parse_idx
from fathom.data.registry import CifarDataset, IdxDataset, TextDataset, dataset_spec
from fathom.data.sources import resolve_archive, resolve_idx
from fathom.errors import FathomError


@dataclass
class RawDataset:
    """The official splits of a dataset, exactly as published (no normalisation).

    Images are uint8 (``[N, 28, 28]`` for MNIST-like, ``[N, 3, 32, 32]`` for CIFAR);
    labels int64 ``[N]``. ``files`` maps each file name to its verified SHA-256 and
    ``source`` names the source(s) that supplied them, joined by ``+``.
    """

    name: str
    classes: int
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    files: dict[str, str]
    source: str


def load_raw(
    name: str, data_dir: str | os.PathLike | None = None, *, download: bool = True
) -> RawDataset:
    """Load dataset ``name`` after verifying every file against the registry's digests.

    Sources are tried in the order documented in :mod:`fathom.data.sources`; with
    ``download=False`` only local files (explicit path, cache, OS package) are used.
    """
    spec = dataset_spec(name)
    if isinstance(spec, TextDataset):
        raise FathomError(
            f"{name!r} is a text corpus, not a set of labelled images: read it as token windows "
            "(fathom.data.text.prepare_text, or a run with data.dataset = "
            f"{name!r} and data.context)"
        )
    if isinstance(spec, CifarDataset):
        path, source = resolve_archive(spec, data_dir)
        arrays = read_cifar_archive(path, spec)
        return RawDataset(
            name=spec.name,
            classes=spec.classes,
            files={spec.archive: spec.sha256},
            source=source,
            **arrays,
        )
    resolved = resolve_idx(spec, data_dir, download=download)
    split = {
        key: _parse_idx_split(spec, role, resolved.contents[role], resolved.paths)
        for key, role in (
            ("train_x", "train-images"),
            ("train_y", "train-labels"),
            ("test_x", "test-images"),
            ("test_y", "test-labels"),
        )
    }
    return RawDataset(
        name=spec.name, classes=spec.classes, files=resolved.files, source=resolved.source, **split
    )


def _parse_idx_split(spec: IdxDataset, role: str, data: bytes, paths: dict) -> torch.Tensor:
    """Parse one verified IDX file and check it against the registry's shape and classes."""
    f = spec.file(role)
    where = str(paths.get(f.name, f.name))
    values = parse_idx(data, where)
    size = spec.train_size if role.startswith("train") else spec.test_size
    shape = (size, *spec.image_shape) if role.endswith("images") else (size,)
    if values.dtype != torch.uint8 or tuple(values.shape) != shape:
        raise FathomError(
            f"{where}: expected uint8 {shape}, got {values.dtype} {tuple(values.shape)}. "
            f"Delete it and run `fathom data fetch {spec.name}`."
        )
    if role.endswith("labels"):
        if values.numel() and int(values.max()) >= spec.classes:
            raise FathomError(
                f"{where}: label {int(values.max())} outside [0, {spec.classes}). "
                f"Delete it and run `fathom data fetch {spec.name}`."
            )
        return values.to(torch.int64)
    return values
