"""Pipeline definitions for ``fathom reproduce``: a study plus what runs on its outputs.

A pipeline preset lives in ``fathom/reproduce/pipelines.toml`` (one table per preset:
``quick``, ``seed-003``); a pipeline TOML of your own has the same keys at top level, and
its ``study`` may be a study TOML path relative to that file.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fathom.config import load_toml, parse_toml
from fathom.errors import FathomError, validation_message, with_suggestion
from fathom.study.config import StudyConfig, load_study

_CENTRAL_RECIPES: tuple[str, ...] = ("residual", "sd_constant", "sd_decreasing")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AuditStep(_Strict):
    enabled: bool = True
    checkpoint: Literal["selected", "final", "both"] = "both"
    device: str = "cpu"
    router: bool = True
    # further fathom.audit.checkpoint.AuditSettings fields (margin_bins, timing_repeats, ...)
    settings: dict[str, Any] = Field(default_factory=dict)

    def audit_settings(self) -> Any:
        """The :class:`AuditSettings` of this step; an unknown field raises naming it."""
        from fathom.audit.checkpoint import AuditSettings
        from fathom.audit.options import CHECKPOINT_CHOICES

        fixed = {"checkpoints", "router", "device"}
        clash = sorted(fixed & set(self.settings))
        known = set(AuditSettings.__dataclass_fields__)
        unknown = sorted(set(self.settings) - known)
        if clash or unknown:
            raise FathomError(
                f"audit.settings: {clash + unknown} cannot be set there (set checkpoint, router "
                f"and device directly; valid settings: {sorted(known - fixed)})"
            )
        return AuditSettings(
            checkpoints=CHECKPOINT_CHOICES[self.checkpoint],
            router=self.router,
            device=self.device,
            **self.settings,
        )


class CurvatureStep(_Strict):
    enabled: bool = True
    recipes: tuple[str, ...] = _CENTRAL_RECIPES
    seed: int = 101
    epochs: tuple[int, ...] = (0, 1, 5, 10, 20, 50, 100)
    epoch_map: dict[str, int] = Field(default_factory=dict)
    probe: int = Field(default=128, gt=0)
    device: str = "cpu"

    @model_validator(mode="after")
    def _map(self) -> CurvatureStep:
        bad = {k: v for k, v in self.epoch_map.items() if v not in self.epochs}
        if bad:
            raise ValueError(
                f"epoch_map points at snapshots {sorted(set(bad.values()))} that curvature.epochs "
                f"{list(self.epochs)} does not compute; add them to epochs or fix the map"
            )
        return self


class HeadStep(_Strict):
    enabled: bool = True
    preset: str = "ciresan-fidelity"
    seed: int = 104
    epochs: int = Field(default=5, gt=0)
    width_mult: float | None = Field(default=None, gt=0)
    fit_subset: int | None = Field(default=None, gt=0)
    eval_subset: int | None = Field(default=None, gt=0)
    lr: float | None = Field(default=None, gt=0)


class ReportStep(_Strict):
    figures: bool = True


class DepthStep(_Strict):
    """A depth-scaling benchmark: a ``fathom depth-scaling`` preset name or a
    ``kind = "depth_scaling"`` TOML (relative to the pipeline file), then ``overrides``."""

    config: str
    overrides: dict[str, Any] = Field(default_factory=dict)

    def load(self, base: Path | None) -> Any:
        """The :class:`~fathom.depthscale.config.DepthScaleConfig` (bad keys name the fix)."""
        from fathom.depthscale.config import (
            PRESETS,
            DepthScaleConfig,
            make_config,
            validate_depth_scaling,
        )

        if self.config in PRESETS:
            return make_config(self.config, **self.overrides)
        from fathom.study.family import load_config

        path = Path(self.config)
        if base is not None and not path.is_absolute():
            path = base / path
        cfg, origin = load_config(str(path))
        if not isinstance(cfg, DepthScaleConfig):
            raise FathomError(
                f"depth_scaling.config {origin} is a {cfg.kind} config; give a depth-scaling "
                f"preset ({', '.join(PRESETS)}) or a kind = 'depth_scaling' TOML"
            )
        return validate_depth_scaling({**cfg.model_dump(), **self.overrides}, origin)


class PipelineConfig(_Strict):
    """A study pipeline (``study`` and its audit, curvature, head steps) or a depth-scaling
    one (``depth_scaling``: the benchmark, its table beside seed 000's, the verdicts)."""

    description: str = ""
    study: str | None = None
    depth_scaling: DepthStep | None = None
    audit: AuditStep = AuditStep()
    curvature: CurvatureStep = CurvatureStep()
    head: HeadStep = HeadStep(enabled=False)
    report: ReportStep = ReportStep()

    @model_validator(mode="after")
    def _one_kind(self) -> PipelineConfig:
        if (self.study is None) == (self.depth_scaling is None):
            raise ValueError("give exactly one of study (a study pipeline) or [depth_scaling]")
        steps = sorted({"audit", "curvature", "head", "report"} & self.model_fields_set)
        if self.depth_scaling is not None and steps:
            raise ValueError(
                f"{steps} are steps of a study pipeline, not of a depth-scaling one; remove them"
            )
        return self


def _validate(data: dict[str, Any], origin: str) -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as e:
        raise FathomError(validation_message(e, origin)) from None


def _presets() -> dict[str, Any]:
    text = (resources.files("fathom") / "reproduce" / "pipelines.toml").read_text("utf-8")
    return parse_toml(text, "the shipped pipelines.toml")


def pipeline_preset_names() -> list[str]:
    """The pipeline presets of ``fathom reproduce`` (``quick``, ``seed-003``, ...)."""
    return sorted(_presets())


def _check_against_study(pipe: PipelineConfig, study: StudyConfig, origin: str) -> None:
    """Curvature recipes and epochs must exist in the study (checked before anything runs)."""
    c = pipe.curvature
    if not c.enabled:
        return
    missing = [r for r in c.recipes if r not in study.study.recipes]
    if missing or c.seed not in study.study.seeds:
        raise FathomError(
            f"pipeline {origin}: curvature of recipes {list(c.recipes)} at seed {c.seed} needs "
            f"them in the study (recipes {list(study.study.recipes)}, seeds "
            f"{list(study.study.seeds)}); fix [curvature] recipes/seed"
        )
    unsaved = [e for e in c.epochs if e not in study.base.checkpoints.save_epochs]
    if unsaved:
        raise FathomError(
            f"pipeline {origin}: curvature epochs {unsaved} are not saved by the study "
            f"(checkpoints.save_epochs = {list(study.base.checkpoints.save_epochs)}); choose "
            "saved epochs in [curvature] epochs"
        )


def load_pipeline(name_or_path: str) -> tuple[str, PipelineConfig, Any, str]:
    """``(name, pipeline, target, origin)`` from a preset name or a pipeline TOML path;
    ``target`` is the :class:`StudyConfig`, or for a depth-scaling pipeline its
    :class:`~fathom.depthscale.config.DepthScaleConfig`."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        data = load_toml(path, "pipeline file")
        pipe, origin, name = _validate(data, str(path)), str(path), path.stem
        base: Path | None = path.parent
        study_ref = pipe.study
        if study_ref and study_ref.endswith(".toml") and not Path(study_ref).is_absolute():
            study_ref = str(path.parent / study_ref)
    else:
        presets = _presets()
        if name_or_path not in presets:
            unknown = with_suggestion(
                f"unknown reproduce preset {name_or_path!r}", name_or_path, presets
            )
            raise FathomError(
                f"{unknown}, and no such file; valid presets: "
                f"{', '.join(sorted(presets))}, or pass a pipeline TOML path"
            )
        name, origin = name_or_path, f"preset {name_or_path}"
        pipe = _validate(presets[name], origin)
        study_ref, base = pipe.study, None
    if pipe.depth_scaling is not None:
        return name, pipe, pipe.depth_scaling.load(base), origin
    assert study_ref is not None  # the validator: a study pipeline names its study
    study, _ = load_study(study_ref)
    _check_against_study(pipe, study, origin)
    return name, pipe, study, origin
