"""A user's own model and data for the "done means" test: a small residual CNN factory
(``model.kind = "python"``, ``factory = "done_means_models:residual_cnn"``) and a TOML
writer for run configs (no TOML writer ships with the standard library)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from fathom.depth import SkippableResidual


class ResidualCNN(nn.Module):
    """``stem (conv 3x3) -> blocks x [x + branch(x)] -> global mean -> linear head``.

    Each block's branch (conv 3x3, BatchNorm, ReLU) is a :class:`SkippableResidual`, so the
    layer-removal audit has ``blocks`` removable branches.
    """

    def __init__(self, channels: int = 4, blocks: int = 2, classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU())
        self.blocks = nn.Sequential(
            *(
                SkippableResidual(
                    nn.Sequential(
                        nn.Conv2d(channels, channels, 3, padding=1),
                        nn.BatchNorm2d(channels),
                        nn.ReLU(),
                    )
                )
                for _ in range(blocks)
            )
        )
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def residual_cnn(channels: int = 4, blocks: int = 2, classes: int = 3) -> nn.Module:
    return ResidualCNN(channels, blocks, classes)


def write_images_npz(path: Path, n: int = 240, classes: int = 3, side: int = 8) -> Path:
    """``x`` float32 ``[n, 1, side, side]`` (class c: a bright c-th horizontal band), ``y``."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, classes, n)
    x = rng.standard_normal((n, 1, side, side)).astype(np.float32) * 0.3
    band = side // classes
    for i, c in enumerate(y):
        x[i, 0, c * band : (c + 1) * band] += 1.5
    np.savez(path, x=x, y=y)
    return path


def _value(v: Any) -> str:
    return json.dumps(v)  # strings, numbers, booleans and flat lists are valid TOML this way


def write_toml(path: Path, data: dict[str, Any]) -> Path:
    """A TOML file of nested dicts of scalars and lists; ``None`` values are left out."""
    lines: list[str] = []

    def table(prefix: str, d: dict[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if v is not None and not isinstance(v, dict)}
        if prefix:
            lines.append(f"[{prefix}]")
        lines.extend(f"{k} = {_value(v)}" for k, v in scalars.items())
        for k, v in d.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", data)
    path.write_text("\n".join(lines) + "\n")
    return path
