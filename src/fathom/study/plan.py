"""The runs of a study: tuning grid and main phase, as plain, picklable specs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fathom.study.config import StudyConfig


@dataclass(frozen=True)
class RunSpec:
    """One run of a study. ``config`` is the full run config (``RunConfig.model_dump``)."""

    run_id: str
    study: str
    phase: str | None  # "tuning" | "main" | None (a lone run, e.g. a diagnostic pair)
    recipe: str
    seed: int
    lr: float
    run_dir: str
    config: dict[str, Any]


def _lr_tag(lr: float) -> str:
    """A file-name-safe learning-rate tag: ``0.03 -> "0.03"``, ``1e-05 -> "1e-05"``."""
    return format(lr, "g")


#: Run-id prefixes of a study's runs (directory names only: the phase is a manifest field).
TUNING_PREFIX, MAIN_PREFIX = "tune-", "main-"


def study_root(runs_dir: str | Path, study: StudyConfig) -> Path:
    return Path(runs_dir) / study.study.name


def _spec(
    study: StudyConfig, runs_dir: str | Path, phase: str, recipe: str, seed: int, lr: float
) -> RunSpec:
    run_id = (
        f"{TUNING_PREFIX}{recipe}-lr{_lr_tag(lr)}-s{seed}"
        if phase == "tuning"
        else f"{MAIN_PREFIX}{recipe}-s{seed}"
    )
    cfg = study.run_config(recipe=recipe, seed=seed, lr=lr, run_id=run_id)
    return RunSpec(
        run_id=run_id,
        study=study.study.name,
        phase=phase,
        recipe=recipe,
        seed=seed,
        lr=lr,
        run_dir=str(study_root(runs_dir, study) / run_id),
        config=cfg.model_dump(mode="json"),
    )


def tuning_specs(study: StudyConfig, runs_dir: str | Path) -> list[RunSpec]:
    """Every recipe at the tuning seed over the learning-rate grid (empty when disabled or
    when the rates are frozen)."""
    if not study.tuning.runs_grid:
        return []
    return [
        _spec(study, runs_dir, "tuning", recipe, study.tuning.seed, lr)
        for recipe in study.study.recipes
        for lr in study.tuning.lrs
    ]


def main_specs(study: StudyConfig, runs_dir: str | Path, lrs: dict[str, float]) -> list[RunSpec]:
    """Every recipe at its learning rate over the main seeds.

    ``lrs`` is the tuning phase's selection, or :meth:`StudyConfig.fixed_lrs` (frozen
    per-recipe rates or the one ``study.lr``) when the study has no tuning phase.
    """
    return [
        _spec(study, runs_dir, "main", recipe, seed, lrs[recipe])
        for recipe in study.study.recipes
        for seed in study.study.seeds
    ]
