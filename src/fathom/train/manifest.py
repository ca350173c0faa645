"""The trainer's manifest sections (data, telemetry), typed by :mod:`fathom.rundir.sections`;
:class:`fathom.rundir.RunWriter` writes them. ``docs/architecture.md`` fixes the fields."""

from __future__ import annotations

import math
from typing import Any

from fathom.data import DataSplits
from fathom.data.paths import paths_base
from fathom.data.registry import registered_shape
from fathom.data.splits import splits_digest
from fathom.errors import FathomError
from fathom.rundir.sections import Data, Telemetry


def split_classes(splits: DataSplits, dataset: str) -> int:
    """The class count of the run's data: ``splits.info["classes"]`` (every data source sets
    it), else the registered ``dataset``'s when the examples have its size; refused
    otherwise (splits of other data without the count), never a guessed 10."""
    if splits.info.get("classes") is not None:
        return int(splits.info["classes"])
    what = 'the class count (splits.info["classes"])'
    classes, shape = registered_shape(dataset, what)
    if splits.fit_x[0].numel() != math.prod(shape):
        raise FathomError(
            f"{what} not given, and the examples ({list(splits.fit_x.shape[1:])}) are not "
            f"dataset {dataset!r}'s ({list(shape)}); set splits.info['classes'] from the data"
        )
    return classes


def dataset_record(splits: DataSplits, cfg, base: str | None = None) -> Data:
    """The manifest's ``data`` section: files and their content hashes, split, the split
    tensors' digest (:func:`splits_digest`), sizes, shapes, and the directory the config's
    relative data paths are relative to (``info.paths_base``: ``base``, the one a resumed run
    recorded, else the working directory, :func:`fathom.data.paths.paths_base`)."""
    info = dict(splits.info)
    info["classes"] = split_classes(splits, cfg.data.dataset)
    info["in_features"] = int(splits.fit_x[0].numel())
    info["input_shape"] = [int(d) for d in splits.fit_x.shape[1:]]
    info["input_dtype"] = str(splits.fit_x.dtype).removeprefix("torch.")
    if (base := base or paths_base(cfg.data)) is not None:
        info["paths_base"] = base  # what the config's relative data paths are relative to
    return Data(
        dataset=cfg.data.dataset,
        files=info.pop("files", {}),
        split_mode=info.get("mode", cfg.data.split),
        split_seed=cfg.data.split_seed,
        split_hash=splits.split_hash,
        tensors_sha256=splits_digest(splits),
        sizes={
            "fit": int(splits.fit_y.shape[0]),
            "val": int(splits.val_y.shape[0]),
            "test": int(splits.test_y.shape[0]),
        },
        info=info,
    )


def telemetry_record(
    clocks,
    enabled: bool,
    layers: list[dict[str, Any]] | None,
    schema_changes: list[dict[str, Any]] | None = None,
    left_out: dict[str, str] | None = None,
) -> Telemetry:
    """``total_s``, ``cold_s``, the overhead ratios telemetry clock / training clock
    (``tel / train`` and ``(tel - cold) / train``, ``None`` before any training time), the
    instrumented ``layers`` and the recorder's ``schema_changes`` (field-set changes) and the families an alias left out (``left_out``, ``None`` when none)."""
    tel, train = clocks.telemetry_s, clocks.training_s
    cold = clocks.telemetry_cold_s
    return Telemetry(
        enabled=enabled,
        total_s=tel,
        cold_s=cold,
        overhead_ratio=tel / train if train > 0 else None,
        overhead_ratio_without_cold=(tel - (cold or 0.0)) / train if train > 0 else None,
        layers=layers,
        schema_changes=schema_changes,
        families_left_out=left_out or None,
    )
