"""The data an analysis reads is the data the run was computed from, or it is refused.

:func:`verified_splits` is the one way an analysis (curvature, audit, a report's checks)
gets a run's data: the splits re-derived from the run's config, its relative data paths
resolved from any working directory (:func:`fathom.data.paths.resolved_data_config`), then
:func:`check_recorded_data` compares them with the manifest's record:

* ``data.tensors_sha256``: the content of the six split tensors
  (:func:`fathom.data.splits.splits_digest`), whatever the source: a registered dataset, a
  user's ``.npz`` / ``.pt`` file, a factory;
* ``data.files``: the content hash of every dataset file (runs recorded before the tensors'
  digest are still bound to their files' content);
* ``data.split_hash``: how the data was split.

The manifest is read through :class:`~fathom.rundir.record.RecordedRun` (``RunDir.recorded``,
any format): a field it lacks (written before it was recorded) is not compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fathom.errors import FathomError

if TYPE_CHECKING:
    import torch

    from fathom.config import DataConfig
    from fathom.data import DataSplits
    from fathom.rundir.record import RecordedRun


def recorded_base(run: RecordedRun | None) -> str | None:
    """The directory the run's relative data paths are relative to (``data.info.paths_base``,
    in the open section a data source records about itself)."""
    return None if run is None else run.data.info.paths_base


def run_data_config(run: RecordedRun, cfg: DataConfig, run_dir: Path) -> DataConfig:
    """The run's data config with its relative paths resolved (from any working directory)."""
    from fathom.data.paths import resolved_data_config

    return resolved_data_config(cfg, recorded_base(run), run_dir)


def verified_splits(
    run: RecordedRun, cfg: DataConfig, run_dir: Path, device: str | torch.device = "cpu"
) -> DataSplits:
    """The run's splits, re-derived from ``cfg`` (its data config) and checked against the
    recorded content (:func:`check_recorded_data`)."""
    import torch

    from fathom.data.prepare import prepare_splits

    data = run_data_config(run, cfg, run_dir)
    splits = prepare_splits(data, torch.device(device))
    check_recorded_data(run, splits, run_dir, data)
    return splits


def check_recorded_data(
    run: RecordedRun, splits: DataSplits, run_dir: Path, cfg: DataConfig
) -> None:
    """Refuse ``splits`` unless their content, files and split are the recorded ones."""
    from fathom.data.splits import splits_digest

    recorded = run.data.given()
    found = {
        "files": dict(splits.info.get("files") or {}),
        "tensors_sha256": splits_digest(splits),
        "split_hash": splits.split_hash,
    }
    for key, now in found.items():
        if key in recorded and recorded[key] != now:
            raise FathomError(
                f"the data of run {str(run_dir)!r} is not the data it was trained on: "
                f"data.{key} recorded {_short(recorded[key])}, the data read now from "
                f"{_source(cfg)} gives {_short(now)}. The dataset file was regenerated, "
                "replaced or edited since the run was trained. Restore the original file "
                "(or point the run at it), or train the run again on the new data"
            )


def _source(cfg: DataConfig) -> str:
    if cfg.dataset == "tensors":
        return f"data.path {cfg.path!r}"
    if cfg.dataset == "python":
        return f"data.factory {cfg.factory!r}"
    where = f" in {cfg.data_dir!r}" if cfg.data_dir else ""
    return f"dataset {cfg.dataset!r}{where}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 90 else text[:87] + "..."
