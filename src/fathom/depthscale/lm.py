"""The depth-scaling benchmark on a language model: a GPT at several depths, dense against
LayerDrop, scored in nats per token.

A benchmark is a plan: every (depth, arm, seed) is one ordinary ``gpt`` run config
(:func:`_lm_run_config`) trained by the one trainer (AdamW, warmup-cosine, clipping); the
arms differ only in ``model.layerdrop`` (``dense``: 0, ``LayerDrop``: ``layerdrop``, every
block's drop probability or the last one's under ``layerdrop_rule = "linear"``). Each run is
scored by its test nats/token at the epoch of minimum validation nats/token (the test split
never selects); the verdict is :func:`fathom.stats.lm_scaling.lm_depth_verdict`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

import fathom.config.limits as limits
from fathom.config import RunConfig, validate_run_config
from fathom.config.models import Float, Int
from fathom.errors import FathomError, with_suggestion

LM_ARMS: tuple[str, str] = ("dense", "LayerDrop")
LM_BENCHMARK = "lm_depth_scaling"


class LMDepthScaleConfig(BaseModel):
    """One language-model benchmark: every (depth, arm, seed) run shares everything else."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: Literal["lm_depth_scaling"] = "lm_depth_scaling"
    dataset: Literal["moby-dick", "text"] = "moby-dick"
    path: str | None = None  # the UTF-8 file of dataset "text"
    data_dir: str | None = None
    context: Int = Field(default=64, gt=1, le=limits.MAX_EXAMPLES)
    depths: list[Int] = Field(default_factory=lambda: [2, 4, 6, 8])
    width: Int = Field(default=64, gt=0, le=limits.MAX_WIDTH)
    heads: Int = Field(default=4, gt=0)
    layerdrop: Float = 0.2
    layerdrop_rule: Literal["uniform", "linear"] = "uniform"
    epochs: Int = Field(default=1, ge=1, le=limits.MAX_EPOCHS)
    batch_size: Int = Field(default=32, ge=1, le=limits.MAX_EXAMPLES)
    lr: Float = 3e-3
    weight_decay: Float = 0.1
    clip_norm: Float = 1.0
    warmup_epochs: Float = 0.1
    seeds: list[Int] = Field(default_factory=lambda: [0, 1])
    fit_subset: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    eval_subset: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    eval_batch_size: Int = Field(default=128, gt=0, le=limits.MAX_EXAMPLES)
    device: str = "auto"
    threads: Int | None = None
    runs_dir: str = "runs"
    preset: str | None = None

    @field_validator("depths")
    @classmethod
    def _depths(cls, v: list[int]) -> list[int]:
        if not v or any(d < 1 or d > limits.MAX_LAYERS for d in v):
            raise ValueError(f"give depths between 1 and {limits.MAX_LAYERS} blocks, got {v}")
        return sorted(set(v))

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if not v or len(set(v)) != len(v):
            raise ValueError(f"give one or more distinct seeds, got {v}")
        return v

    @field_validator("layerdrop")
    @classmethod
    def _layerdrop(cls, v: float) -> float:
        if not 0 < v < 1:
            raise ValueError(f"the LayerDrop arm's probability must be in (0, 1), got {v}")
        return v

    def arm_layerdrop(self, arm: str) -> float:
        return 0.0 if arm == "dense" else self.layerdrop


def _lm_run_name(depth: int, arm: str, seed: int) -> str:
    return f"d{depth:02d}-{arm.lower()}-s{seed}"


def _lm_run_config(
    cfg: LMDepthScaleConfig, depth: int, arm: str, seed: int, study: str
) -> RunConfig:
    """The ``gpt`` run of one (depth, arm, seed): AdamW (β = 0.9, 0.95), warmup-cosine to a
    tenth of ``lr``, clipping at ``clip_norm``, scores every epoch, the last weights kept."""
    data: dict[str, Any] = {"dataset": cfg.dataset, "context": cfg.context}
    for key in ("path", "data_dir", "fit_subset", "eval_subset"):
        if getattr(cfg, key) is not None:
            data[key] = getattr(cfg, key)
    values = {
        "kind": "run",
        "name": _lm_run_name(depth, arm, seed),
        "study": study,
        "seed": seed,
        "device": cfg.device,
        "data": data,
        "model": {
            "kind": "gpt",
            "layers": depth,
            "width": cfg.width,
            "heads": cfg.heads,
            "layerdrop": cfg.arm_layerdrop(arm),
            "layerdrop_rule": cfg.layerdrop_rule,
        },
        "optim": {
            "name": "adamw",
            "lr": cfg.lr,
            "betas": [0.9, 0.95],
            "weight_decay": cfg.weight_decay,
            "clip_norm": cfg.clip_norm,
            "batch_size": cfg.batch_size,
            "epochs": cfg.epochs,
            "schedule": {
                "kind": "warmup_cosine",
                "warmup_epochs": cfg.warmup_epochs,
                "final": 0.1,
            },
        },
        "eval": {"every": 1, "first": [1], "batch_size": cfg.eval_batch_size},
        "checkpoints": {"save_epochs": [0], "resume_every": 1},
        "execution": {"path": "eager", "precision": "fp32"},
        "tags": {"benchmark": LM_BENCHMARK, "depth": depth, "arm": arm},
    }
    return validate_run_config(values, origin=f"depth-scaling run {_lm_run_name(depth, arm, seed)}")


def plan_lm_runs(cfg: LMDepthScaleConfig, study: str) -> list[RunConfig]:
    """Every (depth, arm, seed) run, depth-major."""
    return [
        _lm_run_config(cfg, d, arm, s, study)
        for d in cfg.depths
        for arm in LM_ARMS
        for s in cfg.seeds
    ]


_GPT_QUICK: dict[str, Any] = {
    "dataset": "moby-dick",
    "context": 32,
    "depths": [2, 4, 6, 8],
    "width": 32,
    "heads": 2,
    "layerdrop": 0.2,
    "epochs": 2,
    "batch_size": 32,
    "lr": 1e-2,
    "seeds": [0, 1],
    "fit_subset": 4096,
    "eval_subset": 256,
    "device": "cpu",
    "threads": 1,
}
"""CPU-sized: width 32 (2 heads), context 32 bytes, 4,096 fitting windows, 2 epochs (256
steps, lr 1e-2), 256 validation and 256 test windows, depths 2/4/6/8, two seeds, both arms
(16 runs). A CPU smoke-test protocol: the verdict it reaches is about this small model. (At
1 epoch of 2,048 windows and lr 3e-3 most runs ended within 0.01 nats/token of the unigram
baseline, so most were counted failed.) Measured once (2-core shared CPU, 2026-12-06, about
11 minutes): every run below the unigram baseline (3.18 nats/token at context 32); dense
2.66–3.03, LayerDrop 2.86–3.09 nats/token; both answers not established (two seeds)."""

_GPT_GPU: dict[str, Any] = {
    "dataset": "moby-dick",
    "context": 256,
    "depths": [2, 4, 6, 8, 12],
    "width": 384,
    "heads": 6,
    "layerdrop": 0.2,
    "epochs": 10,
    "batch_size": 64,
    "lr": 1e-3,
    "warmup_epochs": 0.5,
    "seeds": [0, 1, 2],
    "device": "auto",
}
"""GPU-sized (gpt-full's blocks): width 384 (6 heads), context 256, the whole corpus, 10
epochs, depths 2 to 12, three seeds, both arms (30 runs). Not run on the CPU."""

LM_PRESETS: dict[str, dict[str, Any]] = {"gpt-quick": _GPT_QUICK, "gpt-gpu": _GPT_GPU}


def make_lm_config(preset: str | None = None, **overrides: Any) -> LMDepthScaleConfig:
    """Preset values, then ``overrides`` (``None`` values ignored); bad keys named."""
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in LM_PRESETS:
            unknown = with_suggestion(f"unknown preset {preset!r}", preset, LM_PRESETS)
            raise FathomError(f"{unknown}; use one of {', '.join(LM_PRESETS)}")
        values.update(LM_PRESETS[preset], preset=preset)
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return LMDepthScaleConfig(**values)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
            for err in e.errors()
        )
        raise FathomError(
            f"invalid language-model depth-scaling configuration: {problems}"
        ) from None


def lm_scale_note(cfg: LMDepthScaleConfig) -> str:
    """``Setup: ...``: what sets the magnitudes; a CPU preset says it is scaled down."""
    parts = [
        f"GPT width {cfg.width}, {cfg.heads} heads, context {cfg.context}, {cfg.dataset}",
        f"LayerDrop p={cfg.layerdrop:g} ({cfg.layerdrop_rule}), epochs={cfg.epochs}, "
        f"seeds={cfg.seeds}",
        f"fit subset={cfg.fit_subset or 'all'}, eval subset={cfg.eval_subset or 'all'} windows",
        f"device={cfg.device}",
    ]
    if cfg.preset == "gpt-quick":
        parts.insert(0, "preset gpt-quick (CPU-sized; not a full-size result)")
    elif cfg.preset:
        parts.insert(0, f"preset {cfg.preset}")
    return "Setup: " + "; ".join(parts) + "."
