"""Read a run directory: the contract every analysis, report and export goes through."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from fathom.config import RunConfig, validate_run_config
from fathom.errors import FathomError
from fathom.io import read_jsonl
from fathom.train.checkpoint import load_cpu_state, load_weights

Which = int | Literal["selected", "final"]


class RunDir:
    """A run directory on disk (``manifest.json``, ``history.jsonl``, ``checkpoints/``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        mpath = self.path / "manifest.json"
        if not mpath.exists():
            raise FathomError(
                f"{str(self.path)!r} is not a run directory (no manifest.json); "
                "pass a directory created by `fathom train` or `fathom study run`"
            )
        try:
            self.manifest: dict[str, Any] = json.loads(mpath.read_text())
        except json.JSONDecodeError as e:
            raise FathomError(f"{str(mpath)!r} is corrupt ({e}); the run cannot be read") from None

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r}, status={self.status!r})"

    @property
    def run_id(self) -> str:
        return self.manifest.get("run_id", self.path.name)

    @property
    def status(self) -> str:
        return self.manifest.get("status", "unknown")

    @cached_property
    def config(self) -> RunConfig:
        return validate_run_config(self.manifest["config"], origin=f"{self.path}/manifest.json")

    def history(self) -> list[dict[str, Any]]:
        rows, _ = read_jsonl(self.path / "history.jsonl")
        return rows

    def history_with_errors(self) -> tuple[list[dict[str, Any]], list[int]]:
        """Rows plus the line numbers of truncated or unparsable lines."""
        return read_jsonl(self.path / "history.jsonl")

    def checkpoint_epochs(self) -> list[int]:
        return sorted(int(e) for e in self.manifest.get("checkpoints", {}))

    def _resolve(self, which: Which) -> tuple[Path, str, int]:
        if which == "selected":
            sel = self.manifest.get("selected_checkpoint")
            if not sel:
                raise FathomError(
                    f"run {self.run_id!r} has no selected checkpoint (no validation evaluation yet)"
                )
            return self.path / sel["file"], sel["params_sha256"], int(sel["epoch"])
        if which == "final":
            epoch = (self.manifest.get("final") or {}).get("epoch")
            if epoch is None:
                raise FathomError(
                    f"run {self.run_id!r} has no final checkpoint (status {self.status!r})"
                )
            which = int(epoch)
        entry = self.manifest.get("checkpoints", {}).get(str(int(which)))
        if entry is None:
            raise FathomError(
                f"run {self.run_id!r} has no checkpoint for epoch {which}; saved epochs: "
                f"{self.checkpoint_epochs()} (set checkpoints.save_epochs to keep more)"
            )
        return self.path / entry["file"], entry["params_sha256"], int(which)

    def checkpoint_hash(self, which: Which) -> str:
        return self._resolve(which)[1]

    def checkpoint_epoch(self, which: Which) -> int:
        return self._resolve(which)[2]

    def load_state(self, which: Which) -> dict[str, torch.Tensor]:
        path, digest, _ = self._resolve(which)
        state, _ = load_weights(path, expected_sha256=digest)
        return state

    def build_model(
        self, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> nn.Module:
        from fathom.train.build import build_model

        data = self.manifest.get("data", {})
        classes = int(data.get("info", {}).get("classes", 10))
        in_features = int(data.get("info", {}).get("in_features", 784))
        return build_model(self.config.model, classes, in_features).to(device=device, dtype=dtype)

    def load_model(
        self, which: Which, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> nn.Module:
        """The model at a checkpoint, hash-verified, in eval mode."""
        state = self.load_state(which)
        model = self.build_model(torch.float32, "cpu")
        load_cpu_state(model, state)
        return model.to(device=device, dtype=dtype).eval()

    def load_splits(self, device: str | torch.device = "cpu"):
        """The run's data splits, re-derived and checked against the recorded split hash."""
        from fathom.train.loop import prepare_splits

        splits = prepare_splits(self.config, torch.device(device))
        recorded = self.manifest.get("data", {}).get("split_hash")
        if recorded is not None and recorded != splits.split_hash:
            raise FathomError(
                f"the data splits of run {self.run_id!r} no longer match: recorded split hash "
                f"{recorded}, re-derived {splits.split_hash}. The dataset files or split code changed."
            )
        return splits


def find_runs(root: str | Path) -> list[RunDir]:
    """Every run directory at or below ``root`` (by its manifest.json), sorted by path."""
    root = Path(root)
    if (root / "manifest.json").exists():
        return [RunDir(root)]
    return [
        RunDir(p.parent)
        for p in sorted(root.rglob("manifest.json"))
        if (p.parent / "history.jsonl").exists()
    ]
