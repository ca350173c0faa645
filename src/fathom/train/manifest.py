"""The trainer's manifest sections (data, telemetry); :class:`fathom.rundir.RunWriter`
writes them. ``docs/architecture.md`` fixes the fields."""

from __future__ import annotations

from typing import Any

from fathom.data import DataSplits


def split_classes(splits: DataSplits) -> int:
    return int(getattr(splits, "classes", None) or splits.info.get("classes") or 10)


def dataset_record(splits: DataSplits, cfg) -> dict[str, Any]:
    """The manifest's ``data`` section: files and their hashes, split, sizes, shapes."""
    info = dict(splits.info)
    info["classes"] = split_classes(splits)
    info["in_features"] = int(splits.fit_x[0].numel())
    info["input_shape"] = [int(d) for d in splits.fit_x.shape[1:]]
    info["input_dtype"] = str(splits.fit_x.dtype).removeprefix("torch.")
    return {
        "dataset": cfg.data.dataset,
        "files": info.pop("files", {}),
        "split_mode": info.get("mode", cfg.data.split),
        "split_seed": cfg.data.split_seed,
        "split_hash": splits.split_hash,
        "sizes": {
            "fit": int(splits.fit_y.shape[0]),
            "val": int(splits.val_y.shape[0]),
            "test": int(splits.test_y.shape[0]),
        },
        "info": info,
    }


def telemetry_record(clocks, enabled: bool) -> dict[str, Any]:
    """``total_s``, ``cold_s`` and the overhead ratios telemetry clock / training clock."""
    tel, train = clocks.telemetry_s, clocks.training_s
    cold = clocks.telemetry_cold_s
    return {
        "enabled": enabled,
        "total_s": tel,
        "cold_s": cold,
        "overhead_ratio": tel / train if train > 0 else None,
        "overhead_ratio_without_cold": (tel - (cold or 0.0)) / train if train > 0 else None,
    }
