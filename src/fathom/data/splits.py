"""Seeded fitting / validation / test splits, recorded by a split hash.

``fit-val``: the official training set (N examples) is permuted by
``torch.randperm(N, generator=torch.Generator().manual_seed(seed))``; the first
``N - val_size`` permuted examples are the fitting set, the last ``val_size`` (default
10,000: 50,000 / 10,000 for MNIST) the validation set. ``fit-all``: all N permuted
examples fit, and there is no validation set (empty tensors). The official test set is
the test set in both modes. ``fit_subset`` keeps the first n fitting examples,
``eval_subset`` the first n of validation and of test.

``split_hash = sha256(canonical JSON of {mode, seed, val_size, fit_subset, eval_subset}
|| permutation as little-endian int64)``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch

from fathom.base.io import tensor_digest
from fathom.data.load import RawDataset
from fathom.errors import FathomError

SPLIT_MODES = ("fit-val", "fit-all")
DEFAULT_VAL_SIZE = 10_000


@dataclass
class DataSplits:
    """Fitting, validation and test tensors on one device; images stay uint8."""

    fit_x: torch.Tensor
    fit_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    split_hash: str
    info: dict[str, Any] = field(default_factory=dict)


_SPLIT_TENSORS = ("fit_x", "fit_y", "val_x", "val_y", "test_x", "test_y")


def splits_digest(splits: DataSplits) -> str:
    """``tensors_sha256``: :func:`fathom.base.io.tensor_digest` of the six split tensors as the
    run trains and evaluates on them (names, dtypes, shapes, bytes; in :data:`_SPLIT_TENSORS`
    order). It covers the data's content whatever its source (files, a factory, tensors
    given in memory), where ``split_hash`` covers only how it was split."""
    return tensor_digest((name, getattr(splits, name)) for name in _SPLIT_TENSORS)


def split_permutation(n: int, seed: int) -> torch.Tensor:
    """The seeded permutation of the ``n`` training indices (CPU, int64)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def _split_digest(
    mode: str,
    seed: int,
    val_size: int | None,
    fit_subset: int | None,
    eval_subset: int | None,
    permutation: torch.Tensor,
) -> str:
    header = {
        "mode": mode,
        "seed": seed,
        "val_size": val_size,
        "fit_subset": fit_subset,
        "eval_subset": eval_subset,
    }
    h = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    h.update(permutation.to(torch.int64).contiguous().numpy().astype("<i8").tobytes())
    return h.hexdigest()


def _check_count(name: str, value: int | None, limit: int, what: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FathomError(f"{name} must be a positive integer or None, got {value!r}.")
    if value > limit:
        raise FathomError(
            f"{name}={value} exceeds the {limit} {what}; use at most {limit} (or None for all)."
        )


def make_splits(
    raw: RawDataset,
    mode: str = "fit-val",
    seed: int = 0,
    fit_subset: int | None = None,
    eval_subset: int | None = None,
    device: str | torch.device = "cpu",
    *,
    val_size: int = DEFAULT_VAL_SIZE,
) -> DataSplits:
    """Split ``raw`` as described in the module docstring and move the tensors to ``device``."""
    if mode not in SPLIT_MODES:
        raise FathomError(f"unknown split mode {mode!r}; use one of: {', '.join(SPLIT_MODES)}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise FathomError(f"split seed must be a non-negative integer, got {seed!r}.")
    n = raw.train_x.shape[0]
    if mode == "fit-val" and (
        isinstance(val_size, bool) or not isinstance(val_size, int) or not 1 <= val_size < n
    ):
        raise FathomError(
            f"val_size must be an integer in [1, {n - 1}] for {raw.name} ({n} training examples), "
            f"got {val_size!r}; or use mode 'fit-all'."
        )
    perm = split_permutation(n, seed)
    if mode == "fit-val":
        fit_idx, val_idx = perm[: n - val_size], perm[n - val_size :]
    else:
        fit_idx, val_idx = perm, perm[:0]
    n_test = raw.test_x.shape[0]
    _check_count("fit_subset", fit_subset, fit_idx.numel(), "fitting examples")
    eval_limit = n_test if mode == "fit-all" else min(val_size, n_test)
    _check_count("eval_subset", eval_subset, eval_limit, "validation/test examples")
    fit_idx = fit_idx[:fit_subset]
    val_idx = val_idx[:eval_subset]
    test_sel = slice(0, eval_subset)
    recorded_val = val_size if mode == "fit-val" else None
    split_hash = _split_digest(mode, seed, recorded_val, fit_subset, eval_subset, perm)

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().to(device)

    info: dict[str, Any] = {
        "dataset": raw.name,
        "mode": mode,
        "seed": seed,
        "val_size": recorded_val,
        "sizes": {
            "fit": fit_idx.numel(),
            "val": val_idx.numel(),
            "test": len(range(n_test)[test_sel]),
        },
        "subsets": {"fit": fit_subset, "eval": eval_subset},
        "permutation": f"torch.randperm({n}, generator=torch.Generator().manual_seed({seed}))",
        "validation": (
            f"last {val_size} of the permuted {n} training examples" if mode == "fit-val" else None
        ),
        "note": (
            None
            if mode == "fit-val"
            else f"fit-all: all {n} training examples are used for fitting; there is no validation split"
        ),
        "files": dict(raw.files),
        "source": raw.source,
        "split_hash": split_hash,
    }
    return DataSplits(
        fit_x=put(raw.train_x[fit_idx]),
        fit_y=put(raw.train_y[fit_idx]),
        val_x=put(raw.train_x[val_idx]),
        val_y=put(raw.train_y[val_idx]),
        test_x=put(raw.test_x[test_sel]),
        test_y=put(raw.test_y[test_sel]),
        split_hash=split_hash,
        info=info,
    )
