"""A run's data config -> verified, split, device-resident tensors (registered or user's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fathom.config.models import TEXT_DATASETS
from fathom.data.load import load_raw
from fathom.data.splits import DEFAULT_VAL_SIZE, DataSplits, make_splits
from fathom.data.user import user_raw

if TYPE_CHECKING:
    from fathom.config import DataConfig


def prepare_splits(cfg: DataConfig, device: torch.device | str = "cpu") -> DataSplits:
    """The fitting / validation / test splits of ``cfg``, with ``info["classes"]`` set."""
    if cfg.dataset in TEXT_DATASETS:
        from fathom.data.text import prepare_text

        return prepare_text(cfg, device)
    if cfg.dataset in ("tensors", "python"):
        raw, classes = user_raw(cfg)
        if isinstance(raw, DataSplits):
            return DataSplits(
                *(t.to(device) for t in (raw.fit_x, raw.fit_y, raw.val_x, raw.val_y)),
                raw.test_x.to(device),
                raw.test_y.to(device),
                split_hash=raw.split_hash,
                info=raw.info,
            )
        val_size = cfg.val_size or max(1, int(raw.train_y.shape[0]) // 10)
    else:
        raw = load_raw(cfg.dataset, cfg.data_dir)
        classes, val_size = raw.classes, cfg.val_size or DEFAULT_VAL_SIZE
    splits = make_splits(
        raw,
        mode=cfg.split,
        seed=cfg.split_seed,
        fit_subset=cfg.fit_subset,
        eval_subset=cfg.eval_subset,
        device=device,
        val_size=val_size,
    )
    splits.info["classes"] = classes
    return splits
