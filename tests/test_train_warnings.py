"""A run that ends at chance says so (``fathom.stats.failure_flags``), never a bare "complete"."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fathom.cli import main


def _data(tmp_path: Path, learnable: bool) -> Path:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 400)
    x = rng.standard_normal((400, 12)).astype(np.float32)
    if learnable:
        x[np.arange(400), y] += 6.0
    np.savez(tmp_path / "d.npz", x=x, y=y)
    return tmp_path / "d.npz"


def _train(tmp_path: Path, npz: Path, lr: float) -> int:
    toml = tmp_path / "run.toml"
    toml.write_text(
        f"""
name = "r"
study = "s"
device = "cpu"
[data]
dataset = "tensors"
path = "{npz}"
[model]
widths = [16, 8]
input_scale = 1.0
[optim]
lr = {lr}
epochs = 2
batch_size = 32
[eval]
every = 1
[checkpoints]
save_epochs = [0]
"""
    )
    return main(["train", str(toml), "--runs-dir", str(tmp_path / "runs"), "--quiet"])


def test_a_run_at_chance_warns(tmp_path: Path, capsys) -> None:
    assert _train(tmp_path, _data(tmp_path, learnable=False), lr=1e-4) == 0
    out = capsys.readouterr().out
    assert "complete:" in out
    assert (
        "warning: the run ended at chance: test accuracy" in out
        and "with 4 classes (chance 25.0%)" in out
    )


def test_a_run_that_learns_does_not_warn(tmp_path: Path, capsys) -> None:
    assert _train(tmp_path, _data(tmp_path, learnable=True), lr=0.05) == 0
    out = capsys.readouterr().out
    assert "complete:" in out and "warning:" not in out
