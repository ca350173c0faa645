"""The state of every planned run of a study directory (``fathom study status``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fathom.errors import FathomError
from fathom.rundir import RunDir, run_state
from fathom.study.plan import RunSpec, main_specs, tuning_specs


def _row(spec: RunSpec, epochs: int) -> dict[str, Any]:
    row = {
        "run_id": spec.run_id,
        "phase": spec.phase,
        "recipe": spec.recipe,
        "seed": spec.seed,
        "lr": spec.lr,
    }
    path = Path(spec.run_dir)
    if not (path / "manifest.json").exists():
        return {**row, "status": "not started", "epochs": f"0/{epochs}", "final_params": None}
    rd = RunDir(path)
    status = run_state(rd).status  # running only while a live process holds the run's lock
    return {
        **row,
        "status": status,
        "epochs": f"{rd.record.epochs_completed}/{epochs}",
        "final_params": rd.record.hashes.final_params,
    }


def study_status(root: Path) -> tuple[list[dict[str, Any]], str]:
    """Rows for the tuning runs and, once the rates are selected, the main runs."""
    from fathom.study.selection import grid_point, select_lr
    from fathom.study.studyfile import read_study_file

    study = read_study_file(root)
    runs_dir = root.parent
    epochs = study.base.optim.epochs
    t_specs = tuning_specs(study, runs_dir)
    rows = [_row(s, epochs) for s in t_specs]
    lrs: dict[str, float]
    fixed = study.fixed_lrs()
    if fixed is not None:
        lrs = fixed
    elif all(r["status"] in ("complete", "diverged", "failed") for r in rows):
        try:
            lrs = dict(select_lr([grid_point(s) for s in t_specs]))
        except FathomError:
            lrs = {}
    else:
        lrs = {}
    if len(lrs) == len(study.study.recipes):
        rows += [_row(s, epochs) for s in main_specs(study, runs_dir, lrs)]
    else:
        rows += [
            {
                "run_id": f"main-{r}-s{s}",
                "phase": "main",
                "recipe": r,
                "seed": s,
                "lr": None,
                "status": "waiting for tuning",
                "epochs": f"0/{epochs}",
                "final_params": None,
            }
            for r in study.study.recipes
            for s in study.study.seeds
        ]
    return rows, study.study.name
