"""A user's own tensors as a dataset: an ``.npz`` / ``.pt`` file, or a ``python`` factory.

Accepted array sets (names are the keys of the file or of the dict the factory returns):

* ``fit_x, fit_y, val_x, val_y, test_x, test_y``: the splits as given (no permutation);
* ``train_x, train_y, test_x, test_y``: ``train`` is split into fitting / validation exactly
  like a registered dataset (:func:`fathom.data.splits.make_splits`, ``data.val_size``,
  default a tenth of ``train``);
* ``x, y``: one set; ``torch.randperm(N, generator=manual_seed(split_seed))`` puts the last
  ``data.test_size`` (default a tenth) permuted examples in the test set, the rest is split
  as ``train`` above.

``x`` arrays are uint8 or floating point (cast to float32) with one shape per example;
``y`` integer class labels in ``[0, classes)``, ``classes = max label + 1`` unless an
integer ``classes`` entry is given. Every file is SHA-256 hashed into the manifest; a
factory's arrays are hashed by content (:func:`fathom.base.io.tensor_digest`).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fathom.base.io import sha256_file, tensor_digest
from fathom.base.user_code import call_factory
from fathom.config.models import SPLITS
from fathom.data.load import RawDataset
from fathom.data.splits import DataSplits, split_permutation
from fathom.errors import FathomError

if TYPE_CHECKING:
    from fathom.config import DataConfig

_LAYOUTS: tuple[tuple[str, ...], ...] = (
    SPLITS,
    ("train", "test"),
    ("",),
)


_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
"""The first bytes of a zip archive (``numpy.savez`` writes one; the second: an empty one)."""


def _check_zip(path: Path) -> None:
    """Refuse an ``.npz`` that is no zip archive (a text or ``.npy`` file renamed) before numpy,
    which would read it as a pickle and answer with its ``allow_pickle`` message."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head not in _ZIP_MAGIC:
        what = (
            "is empty"
            if not head
            else "is a .npy array"
            if head.startswith(b"\x93NUM")
            else f"starts with {head!r}, e.g. a text file"
        )
        raise FathomError(
            f"data.path {str(path)!r} is not a readable .npz (not a zip archive: it {what}); "
            "write one with numpy.savez(path, x=..., y=...)"
        )


def _read_arrays(cfg: DataConfig) -> tuple[dict[str, Any], dict[str, str], str]:
    """``(arrays, files: {name: sha256}, origin)`` of a ``tensors`` or ``python`` dataset."""
    if cfg.dataset == "python":
        arrays = call_factory(cfg.factory or "", dict(cfg.kwargs), "data.factory")
        if not isinstance(arrays, dict):
            raise FathomError(
                f"data.factory = {cfg.factory!r} returned a {type(arrays).__name__}; return a dict "
                "of arrays (x/y, train_x/..., or fit_x/... as in fathom.data.user)"
            )
        return arrays, {}, f"data.factory {cfg.factory}"
    path = Path(cfg.path or "")
    if not path.is_file():
        raise FathomError(f"data.path {str(path)!r} is not a file; give a .npz or .pt file")
    if path.suffix == ".npz":
        _check_zip(path)
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # EOFError: empty file
            raise FathomError(
                f"data.path {str(path)!r} is not a readable .npz ({type(e).__name__}: "
                f"{e or 'no data'}); write it with numpy.savez(path, x=..., y=...)"
            ) from None
    elif path.suffix == ".pt":
        try:
            arrays = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many types for a bad file
            raise FathomError(f"data.path {str(path)!r} is not a readable .pt ({e})") from None
        if not isinstance(arrays, dict):
            raise FathomError(
                f"data.path {str(path)!r} holds a {type(arrays).__name__}, not a dict"
            )
    else:
        raise FathomError(f"data.path {str(path)!r}: use a .npz or .pt file")
    return arrays, {path.name: sha256_file(path)}, str(path)


def _tensor(arrays: dict[str, Any], key: str, origin: str) -> torch.Tensor:
    value = arrays[key]
    t = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
    return t.detach().cpu().contiguous()


def _images(t: torch.Tensor, key: str, origin: str) -> torch.Tensor:
    if t.dtype == torch.uint8:
        return t
    if not t.is_floating_point():
        raise FathomError(f"{origin}: {key} has dtype {t.dtype}; inputs must be uint8 or float")
    t = t.to(torch.float32)
    bad = (~torch.isfinite(t)).sum().item()
    if bad:
        raise FathomError(
            f"{origin}: {key} holds {bad} NaN or infinite values; clean the data before training"
        )
    return t


def _labels(t: torch.Tensor, key: str, origin: str) -> torch.Tensor:
    if t.is_floating_point() or t.dtype == torch.bool or t.dim() != 1:
        raise FathomError(
            f"{origin}: {key} must be a 1-D integer array of class labels, got "
            f"{t.dtype} {list(t.shape)}"
        )
    if t.numel() and int(t.min()) < 0:
        raise FathomError(f"{origin}: {key} has negative label {int(t.min())}")
    return t.to(torch.int64)


def _layout(arrays: dict[str, Any], origin: str) -> tuple[str, ...]:
    for names in _LAYOUTS:
        keys = {f"{n}_x" if n else "x" for n in names} | {f"{n}_y" if n else "y" for n in names}
        if keys <= set(arrays):
            return names
    raise FathomError(
        f"{origin} has arrays {sorted(arrays)}; give x/y, train_x/train_y/test_x/test_y, or "
        "fit_x/fit_y/val_x/val_y/test_x/test_y"
    )


def _checked_sets(arrays: dict[str, Any], origin: str) -> tuple[dict[str, tuple], int]:
    """``({set: (x, y)}, classes)`` after every shape, dtype, NaN and label check."""
    names = _layout(arrays, origin)
    sets: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for n in names:
        kx, ky = (f"{n}_x", f"{n}_y") if n else ("x", "y")
        x = _images(_tensor(arrays, kx, origin), kx, origin)
        y = _labels(_tensor(arrays, ky, origin), ky, origin)
        if x.dim() < 2 or x.shape[0] != y.shape[0]:
            raise FathomError(
                f"{origin}: {kx} has shape {list(x.shape)} but {ky} has {y.shape[0]} labels; "
                "give one label per example (first dimension)"
            )
        sets[n or "all"] = (x, y)
    shapes = {k: tuple(x.shape[1:]) for k, (x, _) in sets.items()}
    dtypes = {x.dtype for x, _ in sets.values()}
    if len(set(shapes.values())) != 1 or len(dtypes) != 1:
        raise FathomError(f"{origin}: example shapes / dtypes differ between sets: {shapes}")
    top = max((int(y.max()) for _, y in sets.values() if y.numel()), default=-1) + 1
    classes = int(np.asarray(arrays["classes"])) if "classes" in arrays else top
    if classes < 2 or top > classes:
        raise FathomError(f"{origin}: labels reach {top - 1} but classes = {classes} (need >= 2)")
    return sets, classes


def user_raw(cfg: DataConfig) -> tuple[RawDataset | DataSplits, int]:
    """The user's data as a :class:`RawDataset` (to split) or as given :class:`DataSplits`."""
    arrays, files, origin = _read_arrays(cfg)
    sets, classes = _checked_sets(arrays, origin)
    if not files:
        named = [(f"{k}_{part}", t) for k, pair in sets.items() for part, t in zip("xy", pair)]
        files = {"factory-arrays": tensor_digest(named)}
    if "fit" in sets:
        return _given_splits(sets, files, classes, cfg), classes
    if "all" in sets:
        x, y = sets["all"]
        n = int(y.shape[0])
        n_test = cfg.test_size or max(1, n // 10)
        if not 1 <= n_test < n:
            raise FathomError(f"{origin}: test_size {n_test} leaves no examples of {n} to fit")
        perm = split_permutation(n, cfg.split_seed)
        sets = {
            "train": (x[perm[: n - n_test]], y[perm[: n - n_test]]),
            "test": (x[perm[n - n_test :]], y[perm[n - n_test :]]),
        }
    (tx, ty), (ex, ey) = sets["train"], sets["test"]
    return RawDataset(cfg.dataset, classes, tx, ty, ex, ey, files, origin), classes


def _given_splits(sets: dict, files: dict[str, str], classes: int, cfg: DataConfig) -> DataSplits:
    """The user's fit / val / test as given; subsets keep the first n examples."""
    fit_n, eval_n = cfg.fit_subset, cfg.eval_subset
    header = {"mode": "given", "fit_subset": fit_n, "eval_subset": eval_n, "files": files}
    split_hash = hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()
    (fx, fy), (vx, vy), (ex, ey) = sets["fit"], sets["val"], sets["test"]
    out = {
        "fit": (fx[:fit_n], fy[:fit_n]),
        "val": (vx[:eval_n], vy[:eval_n]),
        "test": (ex[:eval_n], ey[:eval_n]),
    }
    info = {
        "dataset": cfg.dataset,
        "mode": "given",
        "sizes": {k: int(v[1].shape[0]) for k, v in out.items()},
        "subsets": {"fit": fit_n, "eval": eval_n},
        "files": files,
        "source": cfg.path or cfg.factory,
        "split_hash": split_hash,
        "classes": classes,
    }
    return DataSplits(*out["fit"], *out["val"], *out["test"], split_hash=split_hash, info=info)
