"""Run a study: tuning phase, learning-rate selection, main phase, summary.

The tuning phase's selection rule is :func:`fathom.study.selection.select_lr`; the
summary's Markdown rendering is :mod:`fathom.study.markdown`.

A study holds an exclusive lock on its directory for its whole duration: the same
``fathom study run`` started twice is refused, naming the first one's PID.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fathom.config import config_diff
from fathom.config.run import objective_field
from fathom.errors import FathomError
from fathom.rundir import RunDir, refuse_links_out, study_lock
from fathom.stats import summarise_study
from fathom.study.config import StudyConfig
from fathom.study.execute import RunOutcome
from fathom.study.markdown import write_summary
from fathom.study.plan import RunSpec, main_specs, study_root, tuning_specs
from fathom.study.records import run_record
from fathom.study.registry import registry_path
from fathom.study.scaledown import scale_down_sentence, scaled_down
from fathom.study.selection import GridPoint, grid_point, select_lr
from fathom.study.sources import check_sources, source_summary
from fathom.study.studyfile import STUDY_FILE, read_study_file, write_study_file

_LR_RULES: dict[str, str] = {
    "tuning": "minimum validation CE over evaluated epochs; ties to the smaller rate; diverged or failed points never selected",
    "study.lr": "every recipe at the study's one learning rate (study.lr), nothing selected",
    "frozen": "every recipe at its frozen rate (tuning.lr), nothing selected and no tuning run",
}
"""The sentence that says how the main phase's rates were chosen, by source."""


def _lr_rule(study: StudyConfig, source: str) -> str:
    """:data:`_LR_RULES` of ``source``; a tuning grid of a ``[loss]`` table is ranked by that
    loss (:func:`fathom.config.run.objective_field`), and the sentence says so."""
    rule = _LR_RULES[source]
    if source == "tuning" and objective_field(study.base) == "val/loss":
        loss = study.base.loss
        rule = rule.replace("validation CE", f"validation loss ({loss.name}, {loss.reduction})")
    return rule


@dataclass
class StudyResult:
    root: Path
    summary: dict[str, Any]
    outcomes: list[RunOutcome] = field(default_factory=list)
    wall_s: float = 0.0


def _check_study_file(root: Path, study: StudyConfig) -> None:
    """Refuse to mix a changed base config into a study root that holds runs of another."""
    if not (root / STUDY_FILE).exists():
        return
    old = read_study_file(root)
    a, b = old.base.model_dump(mode="json"), study.base.model_dump(mode="json")
    if a != b:
        raise FathomError(
            f"study {study.study.name!r} in {str(root)!r} was run with another base config "
            f"({'; '.join(config_diff(a, b, labels=(' (on disk)', ' (study)')))}); runs of different configs cannot be compared. "
            "Use another --runs-dir or study name"
        )


def run_study(
    study: StudyConfig,
    runs_dir: str | Path,
    backend: Any,
    *,
    retry_failed: bool = False,
    progress: Callable[[str, Any], None] | None = None,
    origin: str = "",
    allow_source_change: bool = False,
) -> StudyResult:
    """Run (or resume) ``study`` under ``runs_dir`` on ``backend``; write the summary files."""
    root = study_root(runs_dir, study)
    if root.exists() and not root.is_dir():
        raise FathomError(
            f"{str(root)!r} is a file, not a study directory; move it away or choose another --runs-dir"
        )
    with study_lock(root):
        refuse_links_out(root, sorted(root.iterdir()), "study directory")
        opts = {"retry_failed": retry_failed, "allow_source_change": allow_source_change}
        return _run_locked(study, runs_dir, backend, opts, progress, origin)


def _run_locked(
    study: StudyConfig,
    runs_dir: str | Path,
    backend: Any,
    opts: dict[str, bool],
    progress: Callable[[str, Any], None] | None,
    origin: str,
) -> StudyResult:
    t0 = time.perf_counter()
    root = study_root(runs_dir, study)
    _check_study_file(root, study)
    write_study_file(root, study, origin)
    reg = str(registry_path(runs_dir))
    from fathom.study.registry import Registry

    Registry(reg)  # fail early on a locked or corrupt registry, before any training

    def report(outcome: RunOutcome) -> None:
        if progress is not None:
            progress("run", outcome)

    outcomes: list[RunOutcome] = []
    grid: list[GridPoint] = []
    t_specs = tuning_specs(study, runs_dir)
    check_sources(t_specs, opts["allow_source_change"])
    if t_specs:
        if progress is not None:
            progress(
                "phase",
                f"tuning: {len(t_specs)} runs ({len(study.study.recipes)} recipes x {len(study.tuning.lrs)} rates, seed {study.tuning.seed})",
            )
        outcomes += backend.run(t_specs, registry_file=reg, progress=report, **opts)
        grid = [grid_point(s) for s in t_specs]
        lrs = select_lr(grid)
    else:
        lrs = study.fixed_lrs() or {}
        if progress is not None:
            rates = ", ".join(f"{r} {lr:g}" for r, lr in lrs.items())
            progress("phase", f"no tuning: learning rates from {study.lr_source()} ({rates})")
    m_specs = main_specs(study, runs_dir, lrs)
    check_sources(m_specs, opts["allow_source_change"])
    if progress is not None:
        progress(
            "phase",
            f"main: {len(m_specs)} runs ({len(study.study.recipes)} recipes x {len(study.study.seeds)} seeds)",
        )
    outcomes += backend.run(m_specs, registry_file=reg, progress=report, **opts)
    summary = _build_summary(study, m_specs, grid, lrs)
    summary["execution"] = {
        "backend": getattr(backend, "name", type(backend).__name__),
        "wall_s": time.perf_counter() - t0,
        "actions": {
            a: sum(o.action == a for o in outcomes) for a in sorted({o.action for o in outcomes})
        },
        "runs": [o.to_dict() for o in outcomes],
        "retried": [{"run_id": o.run_id, "note": o.note} for o in outcomes if o.note],
    }
    summary["integrity"] = integrity(list(t_specs) + list(m_specs))
    summary["sources"] = source_summary(list(t_specs) + list(m_specs))
    write_summary(root, summary)
    return StudyResult(root, summary, outcomes, time.perf_counter() - t0)


def _build_summary(
    study: StudyConfig, m_specs: Sequence[RunSpec], grid: Sequence[GridPoint], lrs: dict[str, float]
) -> dict[str, Any]:
    """:func:`fathom.stats.summarise_study` of the main phase, plus the study's own context."""
    records = [run_record(RunDir(s.run_dir), s.recipe, s.seed, s.lr) for s in m_specs]
    summary = summarise_study(
        records, reference=study.study.reference, target_val_acc=study.study.target_val_acc
    )
    scaled = scaled_down(study)
    devices = sorted({RunDir(s.run_dir).record.environment.device_name for s in m_specs})
    source = study.lr_source()
    grid_on = study.tuning.runs_grid
    return {
        "study": study.study.name,
        "description": study.study.description,
        "scale_down": [d.text for d in scaled],
        "scaled_down": [d.to_dict() for d in scaled],
        "scale_down_sentence": scale_down_sentence(scaled, study.study.protocol),
        "scale_down_notes": list(study.study.scale_down),
        "devices": devices,
        "tuning": {
            "enabled": grid_on,
            "mode": "grid" if grid_on else ("frozen" if source == "frozen" else "off"),
            "seed": study.tuning.seed if grid_on else None,
            "lrs": list(study.tuning.lrs) if grid_on else [],
            "rule": _lr_rule(study, source),
            "grid": [p.to_dict() for p in grid],
            "selected_lr": lrs,
            "lr_source": dict.fromkeys(lrs, source),
        },
        "runs": {
            s.run_id: {
                "recipe": s.recipe,
                "seed": s.seed,
                "lr": s.lr,
                "lr_source": source,
                "run_dir": s.run_dir,
                "status": RunDir(s.run_dir).status,
                "final_params": RunDir(s.run_dir).record.hashes.final_params,
            }
            for s in m_specs
        },
        "stats": summary,
    }


def integrity(specs: Sequence[RunSpec]) -> dict[str, list[str]]:
    """Per run id, every integrity problem its run directory still has (see RunDir.problems)."""
    out = {}
    for s in specs:
        problems = RunDir(s.run_dir).problems(deep=True)  # the checkpoints too, as the summary says
        if problems:
            out[s.run_id] = problems
    return out
