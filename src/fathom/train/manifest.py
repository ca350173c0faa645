"""The trainer's side of the run-directory contract: the manifest record and its writes.

``docs/architecture.md`` fixes the fields. :class:`RunWriter` is the only code in the
trainer that writes ``manifest.json`` and ``history.jsonl`` (atomic writes, one appended
JSON line per row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fathom.data import DataSplits
from fathom.io import append_jsonl, atomic_write_json, atomic_write_text, dumps, read_jsonl

FORMAT = 1


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


class RunWriter:
    """Writes one run directory's manifest and history (one writer per directory)."""

    def __init__(self, run_dir: Path, manifest: dict[str, Any]) -> None:
        self.run_dir, self.manifest = run_dir, manifest

    @property
    def history_path(self) -> Path:
        return self.run_dir / "history.jsonl"

    def start(self, resume_epoch: int | None) -> None:
        """A fresh, empty history; or, on resume, the history cut back to ``resume_epoch``."""
        if resume_epoch is None:
            self.history_path.write_text("")
            return
        rows, _ = read_jsonl(self.history_path)
        kept = [r for r in rows if r["epoch"] <= resume_epoch]
        atomic_write_text(self.history_path, "".join(dumps(r) + "\n" for r in kept))

    def row(self, row: dict[str, Any]) -> None:
        append_jsonl(self.history_path, row)

    def write(self, **updates: Any) -> None:
        self.manifest.update(updates)
        atomic_write_json(self.run_dir / "manifest.json", self.manifest)

    def history(self) -> list[dict[str, Any]]:
        return read_jsonl(self.history_path)[0]
