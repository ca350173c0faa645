"""Validated configuration: pydantic models, TOML loading, clear errors.

A run is one :class:`RunConfig`. Unknown keys are rejected everywhere (``extra="forbid"``),
so a typo never silently falls back to a default.
"""

from __future__ import annotations

import tomllib
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from fathom.errors import FathomError

#: Numbers of every config: an integer field takes no ``true`` or ``2.0``, a float field
#: takes integers but no booleans or strings, and no float is ``inf`` or ``nan``.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DataConfig(_Strict):
    dataset: Literal["mnist", "fashion-mnist"] = "mnist"
    data_dir: str | None = None
    split: Literal["fit-val", "fit-all"] = "fit-val"
    split_seed: Int = 0
    fit_subset: Int | None = Field(default=None, gt=0)
    eval_subset: Int | None = Field(default=None, gt=0)


class ModelConfig(_Strict):
    kind: Literal["ciresan"] = "ciresan"
    recipe: Literal["plain", "residual", "residual_dropout", "sd_constant", "sd_decreasing"] = (
        "residual"
    )
    widths: tuple[Int, ...] = (2500, 2000, 1500, 1000, 500)
    width_mult: Float = Field(default=1.0, gt=0)
    input_scale: Float = Field(default=1 / 255, gt=0)
    output_relu: Bool = False
    unit_dropout: Float | None = None
    drop_probs: tuple[Float, ...] | None = None

    @field_validator("widths")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if len(v) < 2 or any(w <= 0 for w in v):
            raise ValueError("widths needs at least two positive hidden widths")
        return v

    @field_validator("unit_dropout")
    @classmethod
    def _dropout(cls, v: float | None) -> float | None:
        if v is not None and not 0.0 <= v < 1.0:
            raise ValueError(f"unit_dropout must be in [0, 1), got {v}")
        return v

    @field_validator("drop_probs")
    @classmethod
    def _probs(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None:
            for p in v:
                if not 0.0 <= p < 1.0:
                    raise ValueError(
                        f"drop probability {p} is outside [0, 1); to delete a branch use an explicit mask"
                    )
        return v

    @model_validator(mode="after")
    def _crop_needs_narrowing(self) -> ModelConfig:
        if self.recipe != "plain":
            w = self.widths
            for a, b in pairwise(w):
                if b > a:
                    raise ValueError(
                        f"widths {list(w)} increase ({a} -> {b}); the crop bypass of recipe "
                        f"{self.recipe!r} needs non-increasing widths (or use recipe 'plain')"
                    )
        return self


class OptimConfig(_Strict):
    lr: Float = Field(default=0.01, gt=0)
    momentum: Float = Field(default=0.9, ge=0, lt=1)
    weight_decay: Float = Field(default=0.0, ge=0)
    batch_size: Int = Field(default=64, gt=0)
    epochs: Int = Field(default=100, gt=0)
    impl: Literal["foreach", "for-loop", "fused"] = "foreach"
    # piecewise-linear lr multiplier over training progress: [[epoch, multiplier], ...]
    # (fractional epochs allowed, interpolated per step; constant outside the points)
    lr_schedule: tuple[tuple[Float, Float], ...] | None = None

    @field_validator("lr_schedule")
    @classmethod
    def _schedule(cls, v):
        if v is not None:
            if len(v) < 1:
                raise ValueError("lr_schedule needs at least one [epoch, multiplier] point")
            epochs = [e for e, _ in v]
            if epochs != sorted(epochs) or any(m < 0 for _, m in v):
                raise ValueError(
                    "lr_schedule points need increasing epochs and non-negative multipliers"
                )
        return v


class ExecutionConfig(_Strict):
    """How steps are executed; never changes what is computed (beyond stated precision).

    path: ``eager`` (any device), ``graph`` (CUDA graphs, one per branch topology), or
    ``auto`` (graph on CUDA when 2**branches <= 2**max_graph_branches, else eager).
    precision: ``fp32`` (strict), ``tf32`` (FP32 storage, TF32 matmuls on CUDA) or ``bf16``
    (autocast to bfloat16 for the forward/backward matmuls).
    """

    path: Literal["auto", "eager", "graph"] = "auto"
    precision: Literal["fp32", "tf32", "bf16"] = "tf32"
    max_graph_branches: Int = Field(default=6, ge=0, le=10)


class StopConfig(_Strict):
    """Stop early when the *official test* accuracy first reaches ``target_test_acc``.

    The target is monitored on the test set (the output says so); it is a speed benchmark
    rule, not a model-selection rule.
    """

    target_test_acc: Float | None = Field(default=None, gt=0, le=1)


class EvalConfig(_Strict):
    every: Int = Field(default=5, gt=0)
    first: tuple[Int, ...] = (1,)
    splits: tuple[Literal["fit", "val", "test"], ...] = ("fit", "val", "test")
    batch_size: Int = Field(default=2000, gt=0)


class CheckpointConfig(_Strict):
    save_epochs: tuple[Int, ...] = (0, 1, 5, 10, 20, 50, 100)
    resume_every: Int = Field(default=1, gt=0)


class TelemetryConfig(_Strict):
    enabled: Bool = False
    first: tuple[Int, ...] = (0, 1)
    every: Int = Field(default=10, gt=0)
    probe_size: Int = Field(default=128, gt=0)
    families: tuple[str, ...] = ("all",)


class RunConfig(_Strict):
    name: str = "run"
    study: str = "default"
    seed: Int = 101
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    eval: EvalConfig = EvalConfig()
    checkpoints: CheckpointConfig = CheckpointConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    execution: ExecutionConfig = ExecutionConfig()
    stop: StopConfig = StopConfig()

    @model_validator(mode="after")
    def _epochs_in_range(self) -> RunConfig:
        late = [e for e in self.telemetry.first if e > self.optim.epochs]
        if self.telemetry.enabled and late:
            raise ValueError(
                f"telemetry.first names epochs {late} beyond training (epochs = {self.optim.epochs})"
            )
        if self.data.split == "fit-all" and "val" in self.eval.splits:
            raise ValueError(
                "split 'fit-all' has no validation set, but eval.splits includes 'val' "
                "(checkpoint selection needs it): use split 'fit-val' or drop 'val'"
            )
        return self

    def with_updates(self, updates: dict[str, Any]) -> RunConfig:
        """A copy with dotted-key updates, re-validated: ``{"optim.lr": 0.03}``."""
        data = self.model_dump()
        for key, value in updates.items():
            node = data
            parts = key.split(".")
            for p in parts[:-1]:
                if p not in node or not isinstance(node[p], dict):
                    raise FathomError(f"unknown config key {key!r}")
                node = node[p]
            if parts[-1] not in node:
                raise FathomError(f"unknown config key {key!r}; valid keys here: {', '.join(node)}")
            node[parts[-1]] = value
        return validate_run_config(data, origin="updates")


def config_diff(
    a: dict, b: dict, labels: tuple[str, str] = ("", ""), prefix: str = ""
) -> list[str]:
    """Dotted keys whose values differ: ``["optim.lr: 0.01 != 0.03", ...]``.

    ``labels`` name the two sides, e.g. ``(" (on disk)", " (study)")``.
    """
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_diff(va, vb, labels, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r}{labels[0]} != {vb!r}{labels[1]}")
    return out


def _format_validation_error(e: ValidationError, origin: str) -> str:
    lines = [f"invalid configuration ({origin}):"]
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            lines.append(f"  - unknown key {loc!r}: remove it or check its spelling")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"  - {loc}: {msg} (got {err.get('input')!r})")
    return "\n".join(lines)


def validate_run_config(data: dict[str, Any], origin: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise FathomError(_format_validation_error(e, origin)) from None


def load_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise FathomError(f"config file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise FathomError(f"config file {str(path)!r} is not valid TOML: {e}") from None


def load_run_config(path: str | Path) -> RunConfig:
    return validate_run_config(load_toml(path), origin=str(path))
