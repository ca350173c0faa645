"""The tuning phase's learning-rate selection.

Selection rule (tuning phase): for each recipe, the grid rate whose run reaches the
lowest validation objective (its minimum over evaluated epochs, the same quantity that
selects checkpoints, :func:`fathom.config.run.objective_field`: CE, or the ``[loss]``
table's loss); ties go to the smaller rate. A diverged grid point is recorded in the grid
and never selected. A failed or unfinished grid point stops the study before selection
(a rate is never selected without it), naming the run and ``--retry-failed``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fathom.config.run import objective_field
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.study.plan import RunSpec


@dataclass(frozen=True)
class GridPoint:
    """One tuning run: its rate, status, and at its selected epoch the validation CE and,
    for a run with a ``[loss]`` table, that loss (``val_loss``; ``None`` for the default
    loss); each ``None`` when undefined. ``objective`` names the one it is ranked by."""

    recipe: str
    lr: float
    run_id: str
    status: str
    val_ce: float | None
    selected_epoch: int | None
    diverged_epoch: int | None
    status_reason: str | None = None
    val_loss: float | None = None
    objective: str = "val/ce"

    @property
    def score(self) -> float | None:
        """The value it is ranked by: its minimum validation ``objective``."""
        return self.val_loss if self.objective == "val/loss" else self.val_ce

    def to_dict(self) -> dict:
        """Its fields, without ``val_loss`` and ``objective`` for the default loss (a study
        summary of such a grid reads as before they existed)."""
        out = dict(vars(self))
        if self.objective == "val/ce":
            del out["val_loss"], out["objective"]
        return out


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def grid_point(spec: RunSpec) -> GridPoint:
    rd = RunDir(spec.run_dir)
    sel = rd.record.selected
    objective = objective_field(rd.config)
    value = sel.val_loss if objective == "val/loss" else sel.val_ce
    usable = rd.status == "complete" and _finite(value) is not None
    return GridPoint(
        recipe=spec.recipe,
        lr=spec.lr,
        run_id=spec.run_id,
        status=rd.status,
        val_ce=_finite(sel.val_ce) if usable else None,
        selected_epoch=sel.epoch if usable else None,
        diverged_epoch=rd.record.diverged_epoch,
        status_reason=rd.header.status_reason,
        val_loss=_finite(sel.val_loss) if usable else None,
        objective=objective,
    )


def select_lr(points: Sequence[GridPoint]) -> dict[str, float]:
    """Per recipe, the rate with the lowest validation objective (:attr:`GridPoint.score`)
    among complete grid points."""
    by_recipe: dict[str, list[GridPoint]] = {}
    for p in points:
        by_recipe.setdefault(p.recipe, []).append(p)
    chosen = {}
    for recipe, pts in by_recipe.items():
        unfinished = [p for p in pts if p.status not in ("complete", "diverged")]
        if unfinished:
            names = ", ".join(
                f"{p.run_id} ({p.status}: {p.status_reason})"
                for p in sorted(unfinished, key=lambda p: p.lr)
            )
            raise FathomError(
                f"the tuning grid of recipe {recipe!r} is incomplete: {names}. A learning rate "
                "is never selected without every grid point; rerun the study with "
                "--retry-failed to retry them"
            )
        ok = [p for p in pts if p.status == "complete" and p.score is not None]
        if not ok:
            grid = ", ".join(f"lr {p.lr:g}: {p.status}" for p in sorted(pts, key=lambda p: p.lr))
            raise FathomError(
                f"no learning rate of the tuning grid trained recipe {recipe!r} ({grid}); add "
                "smaller rates to tuning.lrs (or retry failed runs with --retry-failed)"
            )
        chosen[recipe] = min(ok, key=lambda p: (p.score, p.lr)).lr
    return chosen
