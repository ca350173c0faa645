"""The depth-scaling benchmark's configuration and its ``quick`` preset."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fathom.config import Bool, Float, Int
from fathom.depthscale.data import NORMALIZATION
from fathom.errors import FathomError
from fathom.models.convnet import blocks_per_stage_for_depth


class DepthScaleConfig(BaseModel):
    """One benchmark: every (depth, arm, seed) run shares everything else.

    Arms: ``vanilla`` (λ_reg = 0) and ``Lyapunov`` (λ_reg = ``lyap_weight``).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    dataset: str = "cifar100"
    data_dir: str | None = None
    depths: list[Int] = Field(default_factory=lambda: [4, 8, 12, 16, 20])
    timesteps: Int = 4
    epochs: Int = 150
    lyap_weight: Float = 0.3
    lyap_target: Float = -0.1
    seeds: list[Int] = Field(default_factory=lambda: [0])
    neuron: str = "lif"
    residual: Bool = False
    batchnorm: Bool = True
    width_mult: Float = 1.0
    batch_size: Int = 128
    lr: Float = 0.1
    momentum: Float = 0.9
    weight_decay: Float = 5e-4
    lyap_subbatch: Int = 16
    probe_size: Int = 8
    health_every: Int = 10
    log_every: Int = 10
    split_seed: Int = 0
    fit_subset: Int | None = None
    eval_subset: Int | None = None
    eval_batch_size: Int = 500
    augment: Bool | None = None
    device: str = "auto"
    threads: Int | None = None
    runs_dir: str = "runs"
    preset: str | None = None

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        if v not in NORMALIZATION:
            raise ValueError(f"unknown dataset {v!r}; use one of {', '.join(NORMALIZATION)}")
        return v

    @field_validator("depths")
    @classmethod
    def _depths(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("give at least one depth")
        for d in v:
            blocks_per_stage_for_depth(d)
        return sorted(set(v))

    @field_validator("timesteps")
    @classmethod
    def _timesteps(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"timesteps must be >= 0 (0 = ANN), got {v}; use e.g. --timesteps 4")
        return v

    @field_validator(
        "epochs", "batch_size", "lyap_subbatch", "probe_size", "health_every", "log_every"
    )
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be >= 1, got {v}")
        return v

    @field_validator("lyap_weight")
    @classmethod
    def _weight(cls, v: float) -> float:
        if v < 0:
            raise ValueError(f"lyap_weight must be >= 0, got {v}")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if not v or len(set(v)) != len(v):
            raise ValueError(f"give one or more distinct seeds, got {v}")
        return v

    @property
    def do_augment(self) -> bool:
        return self.dataset in ("cifar10", "cifar100") if self.augment is None else self.augment


QUICK: dict[str, Any] = {
    "dataset": "mnist",
    "depths": [4, 8, 12],
    "timesteps": 4,
    "epochs": 3,
    "width_mult": 1 / 16,
    "batch_size": 64,
    "lr": 0.05,
    "fit_subset": 1024,
    "eval_subset": 256,
    "lyap_subbatch": 8,
    "probe_size": 4,
    "health_every": 1,
    "log_every": 1,
    "eval_batch_size": 256,
    "device": "cpu",
    "threads": 1,
}
"""CPU-sized: widths (4, 8, 16, 32), 1,024 MNIST fitting examples, 256 validation and 256
test examples, 3 epochs, depths 4/8/12, spiking T=4, one intra-op thread (on a shared
2-core machine one thread was 5x faster per step than two)."""

PRESETS: dict[str, dict[str, Any]] = {"quick": QUICK}


def make_config(preset: str | None = None, **overrides: Any) -> DepthScaleConfig:
    """Preset values, then explicit ``overrides`` (``None`` values are ignored)."""
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise FathomError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
        values.update(PRESETS[preset], preset=preset)
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return DepthScaleConfig(**values)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
            for err in e.errors()
        )
        raise FathomError(f"invalid depth-scaling configuration: {problems}") from None
