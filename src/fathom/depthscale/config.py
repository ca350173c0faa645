"""The depth-scaling benchmark as a config (``kind = "depth_scaling"``) and its presets.

A benchmark is a plan: every (depth, arm, seed) is one ordinary run config
(:func:`run_config`) trained by the one trainer, with the regularized step; the arms
differ only in ``regularizer.weight`` (``vanilla``: 0, ``Lyapunov``: ``lyap_weight``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

import fathom.config.limits as limits
from fathom.config import RunConfig, validate_run_config
from fathom.config.models import Bool, Float, Int, check_timesteps
from fathom.errors import FathomError, with_suggestion
from fathom.models.specs import NORMALIZATION, blocks_per_stage_for_depth

ARMS: tuple[str, str] = ("vanilla", "Lyapunov")


class DepthScaleConfig(BaseModel):
    """One benchmark: every (depth, arm, seed) run shares everything else.

    Arms: ``vanilla`` (λ_reg = 0) and ``Lyapunov`` (λ_reg = ``lyap_weight``).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: Literal["depth_scaling"] = "depth_scaling"
    dataset: str = "cifar100"
    data_dir: str | None = None
    depths: list[Int] = Field(default_factory=lambda: [4, 8, 12, 16, 20])
    timesteps: Int = Field(default=4, le=limits.MAX_TIMESTEPS)
    epochs: Int = Field(default=150, le=limits.MAX_EPOCHS)
    lyap_weight: Float = 0.3
    lyap_target: Float = -0.1
    seeds: list[Int] = Field(default_factory=lambda: [0])
    neuron: str = "lif"
    residual: Bool = False
    batchnorm: Bool = True
    width_mult: Float = Field(default=1.0, gt=0, le=limits.MAX_WIDTH_MULT)
    batch_size: Int = Field(default=128, le=limits.MAX_EXAMPLES)
    lr: Float = 0.1
    momentum: Float = 0.9
    weight_decay: Float = 5e-4
    lyap_subbatch: Int = Field(default=16, le=limits.MAX_EXAMPLES)
    probe_size: Int = Field(default=8, le=limits.MAX_EXAMPLES)
    health_every: Int = Field(default=10, le=limits.MAX_EPOCHS)
    log_every: Int = Field(default=10, le=limits.MAX_EPOCHS)
    split_seed: Int = Field(default=0, ge=0, lt=limits.SEED_BOUND)
    fit_subset: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    eval_subset: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    val_size: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    eval_batch_size: Int = Field(default=500, gt=0, le=limits.MAX_EXAMPLES)
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
        return check_timesteps(v)

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

    def arm_weight(self, arm: str) -> float:
        return 0.0 if arm == "vanilla" else self.lyap_weight


def _run_name(depth: int, arm: str, seed: int) -> str:
    return f"d{depth:02d}-{arm.lower()}-s{seed}"


def run_config(cfg: DepthScaleConfig, depth: int, arm: str, seed: int, study: str) -> RunConfig:
    """The run config of one (depth, arm, seed): SGD with Nesterov momentum, a per-step
    cosine rate ``lr (1 + cos(pi t / E)) / 2``, loss ``CE + λ_reg P``, the health instrument
    every ``health_every`` epochs, dense scores every epoch, the last epoch's weights kept."""
    data = {
        "kind": "run",
        "name": _run_name(depth, arm, seed),
        "study": study,
        "seed": seed,
        "device": cfg.device,
        "data": {
            "dataset": cfg.dataset,
            "data_dir": cfg.data_dir,
            "split": "fit-val",
            "split_seed": cfg.split_seed,
            "val_size": cfg.val_size,
            "fit_subset": cfg.fit_subset,
            "eval_subset": cfg.eval_subset,
            "augment": "crop_flip" if cfg.do_augment else "none",
        },
        "model": {
            "kind": "staged_conv",
            "depth": depth,
            "neuron": cfg.neuron,
            "timesteps": cfg.timesteps,
            "residual": cfg.residual,
            "batchnorm": cfg.batchnorm,
            "width_mult": cfg.width_mult,
        },
        "optim": {
            "name": "sgd",
            "lr": cfg.lr,
            "momentum": cfg.momentum,
            "nesterov": cfg.momentum > 0,
            "weight_decay": cfg.weight_decay,
            "batch_size": cfg.batch_size,
            "epochs": cfg.epochs,
            "schedule": {"kind": "warmup_cosine", "warmup_epochs": 0, "final": 0.0},
        },
        "regularizer": {
            "kind": "lyapunov",
            "weight": cfg.arm_weight(arm),
            "target": cfg.lyap_target,
            "sub_batch": cfg.lyap_subbatch,
        },
        "health": {"enabled": True, "every": cfg.health_every, "probe_size": cfg.probe_size},
        "eval": {"every": 1, "first": [1], "batch_size": cfg.eval_batch_size},
        "checkpoints": {"save_epochs": [0], "resume_every": 1},
        "execution": {"path": "eager", "precision": "fp32"},
        "tags": {"benchmark": "depth_scaling", "depth": depth, "arm": arm},
    }
    return validate_run_config(data, origin=f"depth-scaling run {_run_name(depth, arm, seed)}")


def plan_runs(cfg: DepthScaleConfig, study: str) -> list[RunConfig]:
    """Every (depth, arm, seed) run of the benchmark, depth-major."""
    return [
        run_config(cfg, depth, arm, seed, study)
        for depth in cfg.depths
        for arm in ARMS
        for seed in cfg.seeds
    ]


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

_CPU_DEGRADE: dict[str, Any] = {
    **QUICK,
    "depths": [4, 8, 12, 16],
    "timesteps": 0,
    "batchnorm": False,
    "epochs": 3,
    "fit_subset": 2048,
    "eval_subset": 512,
    "seeds": [0, 1],
}
"""Seed 000 at CPU scale: plain depth visibly degrades. The ANN staged conv net without
BatchNorm (widths 4, 8, 16, 32; default PyTorch init), 2,048 MNIST fitting images padded
to 32x32, 512 validation and 512 test images, 3 epochs, depths 4/8/12/16, two seeds, both
arms. Measured once (seed 0, depths 4 and 16, 2-core shared CPU): vanilla test accuracy
81.3% at depth 4, 13.5% (chance, flagged failed) at depth 16; the Lyapunov arm 88.7% and
13.5%. A CPU smoke-test protocol, not the seed's CIFAR-100 result."""

_CPU_DEGRADE_LIF: dict[str, Any] = {**_CPU_DEGRADE, "timesteps": 2, "neuron": "lif"}
"""The same protocol with spiking LIF neurons (T = 2): about twice the ANN's cost."""

SEED_000: dict[str, Any] = {
    "dataset": "cifar100",
    "depths": [4, 8, 12, 16, 20],
    "timesteps": 4,
    "neuron": "lif",
    "epochs": 150,
    "lyap_weight": 0.3,
    "lyap_target": -0.1,
    "seeds": [0],
    "width_mult": 1.0,
    "batchnorm": True,
    "residual": False,
    "device": "auto",
}
"""Seed 000's CIFAR-100 protocol as its log states it (a GPU job: the log's run took 36 h on
one A40): spiking LIF staged conv nets, T = 4, depths 4/8/12/16/20 (4 stages x 1-5 blocks,
full width: 1,756,836 to 14,298,276 parameters, as logged), vanilla and Lyapunov arms
(λ_reg = 0.3, λ_target = -0.1), 150 epochs, one run per depth and arm. What the log does not
state keeps Fathom's defaults (SGD + Nesterov 0.9, lr 0.1 cosine, weight decay 5e-4, batch
128, crop/flip augmentation). The log printed the last epoch's test accuracy and trained on
all 50,000 images; Fathom holds out 10,000 for validation and reports the test accuracy at
the validation-selected epoch. Set ``seeds`` to several values for a seed-to-seed spread."""

_SEED_000_TINY: dict[str, Any] = {
    **SEED_000,
    "timesteps": 2,
    "epochs": 1,
    "seeds": [0, 1],
    "width_mult": 1 / 16,
    "batch_size": 32,
    "val_size": 32,
    "fit_subset": 64,
    "eval_subset": 32,
    "lyap_subbatch": 4,
    "probe_size": 2,
    "health_every": 1,
    "log_every": 1,
    "eval_batch_size": 64,
    "device": "cpu",
    "threads": 1,
}
"""The seed-000 protocol scaled down to a CPU smoke test (every depth and arm, two seeds, T =
2, widths x 1/16, 64 fitting / 32 validation / 32 test images, 1 epoch): it exercises the
CIFAR-100 reader, the runs, the table and the side-by-side printing, not the result."""


def protocol_reductions(cfg: DepthScaleConfig, protocol: dict[str, Any] = SEED_000) -> list[str]:
    """How ``cfg`` departs from ``protocol`` in what sets the magnitudes (every key of
    ``protocol`` but ``seeds`` and ``device``; a fitting or evaluation subset; another
    validation size): ``["epochs 1 (protocol: 150)", ...]``, empty for the full protocol."""
    out = [
        f"{key} {getattr(cfg, key)!r} (protocol: {want!r})"
        for key, want in protocol.items()
        if key not in ("seeds", "device") and getattr(cfg, key) != want
    ]
    for key in ("fit_subset", "eval_subset", "val_size"):
        if getattr(cfg, key) is not None:
            out.append(f"{key} {getattr(cfg, key)} (protocol: all / default)")
    return out


PRESETS: dict[str, dict[str, Any]] = {
    "quick": QUICK,
    "cpu-degrade": _CPU_DEGRADE,
    "cpu-degrade-lif": _CPU_DEGRADE_LIF,
    "cifar100-seed-000": SEED_000,
    "cifar100-seed-000-tiny": _SEED_000_TINY,
}


def make_config(preset: str | None = None, **overrides: Any) -> DepthScaleConfig:
    """Preset values, then explicit ``overrides`` (``None`` values are ignored)."""
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            from fathom.depthscale.lm import LM_PRESETS

            known = [*PRESETS, *LM_PRESETS]
            unknown = with_suggestion(f"unknown preset {preset!r}", preset, known)
            raise FathomError(f"{unknown}; use one of {', '.join(known)}")
        values.update(PRESETS[preset], preset=preset)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return validate_depth_scaling(values)


def validate_depth_scaling(values: dict[str, Any], origin: str = "") -> DepthScaleConfig:
    """A :class:`DepthScaleConfig`, or a :class:`FathomError` naming every bad key."""
    try:
        return DepthScaleConfig(**values)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
            for err in e.errors()
        )
        where = f" ({origin})" if origin else ""
        raise FathomError(f"invalid depth-scaling configuration{where}: {problems}") from None


def scale_note(cfg: DepthScaleConfig) -> str:
    """``Setup: ...``: the settings that set the magnitudes; a scaled-down preset says so."""
    kind = f"spiking LIF T={cfg.timesteps}" if cfg.neuron == "lif" and cfg.timesteps > 0 else "ANN"
    parts = [
        f"{kind}, width_mult={cfg.width_mult:g}, epochs={cfg.epochs}, seeds={cfg.seeds}",
        f"fit subset={cfg.fit_subset or 'all'}, eval subset={cfg.eval_subset or 'all'}",
        f"λ_reg={cfg.lyap_weight:g}, λ_target={cfg.lyap_target:g}, device={cfg.device}",
    ]
    reduced = protocol_reductions(cfg)
    if cfg.preset and reduced:
        parts.insert(0, f"preset {cfg.preset} (scaled down; not a full-size result)")
    elif cfg.preset:
        parts.insert(0, f"preset {cfg.preset} (seed 000's full CIFAR-100 protocol)")
    return "Setup: " + "; ".join(parts) + "."
