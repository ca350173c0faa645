"""Shared fixtures: tiny synthetic splits and tiny run configs."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from fathom.config import RunConfig
from fathom.data import DataSplits

torch.set_num_threads(1)

# Properties run under a fixed-seed profile in CI and by default (same examples every run, so a
# red run is reproducible); FATHOM_HYPOTHESIS=long explores far more. Each test states its own
# max_examples for the default profile; every counter-example found is kept as a named test.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("FATHOM_HYPOTHESIS", "ci"))

TINY_WIDTHS = (32, 24, 16, 12, 8)


def synthetic_splits(
    n_fit: int = 256, n_eval: int = 128, seed: int = 0, classes: int = 10
) -> DataSplits:
    """Learnable synthetic 'images': class-dependent mean intensity pattern plus noise, uint8."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.rand(classes, 784, generator=g) * 200

    def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, classes, (n,), generator=g)
        x = (protos[y] + torch.rand(n, 784, generator=g) * 55).clamp(0, 255).to(torch.uint8)
        return x.reshape(n, 28, 28), y

    fx, fy = make(n_fit)
    vx, vy = make(n_eval)
    tx, ty = make(n_eval)
    return DataSplits(
        fx,
        fy,
        vx,
        vy,
        tx,
        ty,
        split_hash=f"synthetic-{seed}-{n_fit}-{n_eval}",
        info={"dataset": "synthetic", "classes": classes, "sizes": {"fit": n_fit}},
    )


def tiny_config(**updates) -> RunConfig:
    base = RunConfig(name="tiny", study="test")
    upd = {
        "model.widths": list(TINY_WIDTHS),
        "optim.epochs": 3,
        "optim.batch_size": 32,
        "optim.lr": 0.05,
        "eval.every": 1,
        "device": "cpu",
    }
    epochs = updates.get("optim.epochs", upd["optim.epochs"])
    upd["checkpoints.save_epochs"] = [e for e in (0, 1, 2, 3) if e <= epochs]  # within training
    upd.update(updates)
    return base.with_updates(upd)


@pytest.fixture
def splits() -> DataSplits:
    return synthetic_splits()
