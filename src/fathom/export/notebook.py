"""Runs and studies in a notebook: ``fathom.load_run(path)`` and ``fathom.load_study(path)``.

Both read through the one run-directory reader (:class:`fathom.rundir.RunDir`) and are
verified when loaded: the manifest against its digest, the history against the digest the
writer recorded, no leftover of a killed write (:meth:`RunDir.problems`); a run that fails a
check is refused naming the problem, never read around. A checkpoint is verified when it is
read (file and tensor digests of its manifest entry).

``run.history`` holds the history rows in the units every Fathom rendering and export uses,
the unit in each name (:func:`fathom.export.common.in_export_units`): accuracy in percent
as ``<name>_pct`` (``val/acc_pct``), clocks in seconds as recorded (``clock/training_s``);
every other field as ``history.jsonl`` names it. With pandas installed it is a
``pandas.DataFrame`` (one row per observed epoch, ``attrs["units"]`` the unit of every
declared column, from :mod:`fathom.telemetry.registry`); without, a list of dicts.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fathom.config.model_kinds import model_kind
from fathom.errors import FathomError
from fathom.export.common import accuracy_name, in_export_units
from fathom.rundir import RunDir, RunManifest, Which

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fathom.study.config import StudyConfig


def _frame(rows: list[dict[str, Any]], recorded: list[str]) -> Any:
    """``rows`` as a DataFrame with ``attrs["units"]`` (of the ``recorded`` field names) when
    pandas imports, else ``rows`` itself."""
    try:
        import pandas as pd
    except ImportError:
        return rows
    frame = pd.DataFrame(rows)
    frame.attrs["units"] = _column_units(recorded)
    return frame


def _column_units(recorded: list[str]) -> dict[str, str]:
    """``{column: unit}`` for the history fields ``recorded`` that the registry declares, by
    their exported names: ``%`` for an accuracy (``val/acc`` -> ``val/acc_pct``)."""
    from fathom.base.units import ACCURACY_UNIT
    from fathom.telemetry.registry import field_for

    out: dict[str, str] = {}
    for name in dict.fromkeys(recorded):
        exported = accuracy_name(name)
        if exported is not None:
            out[exported] = ACCURACY_UNIT
            continue
        with suppress(FathomError):  # not a declared field (a user's extra key): no unit
            out[name] = field_for(name).units
    return out


def _verified(path: str | Path) -> RunDir:
    rd = RunDir(path)
    problems = rd.problems()
    if problems:
        raise FathomError(
            f"run {str(rd.path)!r} fails its integrity checks: {'; '.join(problems)}. "
            "Resume it (`fathom train --resume`) or train it again; `fathom runs show` and "
            "`fathom report` list what is wrong"
        )
    rd.record  # noqa: B018  (refuses a manifest that is not a whole typed run manifest)
    return rd


@dataclass(frozen=True, eq=False)
class Run:
    """One verified run directory (:func:`load_run`)."""

    dir: RunDir

    @property
    def path(self) -> Path:
        return self.dir.path

    @property
    def run_id(self) -> str:
        return self.dir.run_id

    @property
    def status(self) -> str:
        return self.dir.status

    @property
    def manifest(self) -> RunManifest:
        """The typed manifest (:class:`fathom.rundir.RunManifest`)."""
        return self.dir.record

    @property
    def config(self) -> Any:
        """The run's validated config (a :class:`fathom.config.RunConfig`)."""
        return self.dir.config

    @cached_property
    def recorded(self) -> list[dict[str, Any]]:
        """The history rows as ``history.jsonl`` holds them (accuracy a fraction)."""
        return self.dir.history()

    @cached_property
    def rows(self) -> list[dict[str, Any]]:
        """The history rows in export units (module docstring), a list of dicts."""
        return [in_export_units(row) for row in self.recorded]

    @property
    def history(self) -> Any:
        """The history: a ``pandas.DataFrame`` when pandas is installed, else :attr:`rows`."""
        return _frame(self.rows, [k for row in self.recorded for k in row])

    def checkpoints(self) -> list[int]:
        """The epochs whose weights were saved (``checkpoints.save_epochs``)."""
        return self.dir.checkpoint_epochs()

    def checkpoint(self, epoch: Which = "final") -> dict[str, torch.Tensor]:
        """The state dict saved at ``epoch`` (an int, ``"selected"`` or ``"final"``), verified
        against the file and tensor digests recorded in the manifest."""
        return self.dir.load_state(epoch)

    def model(self, epoch: Which = "final") -> nn.Module:
        """The run's model with the weights of ``epoch`` (verified), in eval mode."""
        return self.dir.load_model(epoch)

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"Run({str(self.path)!r}, status={self.status!r}, epochs={m.epochs_completed}, "
            f"selected epoch={m.selected.epoch}, checkpoints={self.checkpoints()})"
        )


def load_run(path: str | Path) -> Run:
    """The run directory at ``path`` (written by ``fathom train`` or ``fathom study run``),
    verified (module docstring); a :class:`FathomError` names what is wrong."""
    path = Path(path)
    if (path / "study.json").exists() and not (path / "manifest.json").exists():
        raise FathomError(
            f"{str(path)!r} is a study directory, not a run: load it with "
            f"fathom.load_study({str(path)!r}), or one of its runs with fathom.load_run"
        )
    return Run(_verified(path))


@dataclass(frozen=True, eq=False)
class Study:
    """A study directory (:func:`load_study`): its config and its verified runs by id."""

    path: Path
    config: StudyConfig
    runs: dict[str, Run]

    def run(self, run_id: str) -> Run:
        if run_id not in self.runs:
            from fathom.errors import with_suggestion

            raise FathomError(
                with_suggestion(
                    f"study {self.config.study.name!r} has no run {run_id!r}", run_id, self.runs
                )
                + f"; its runs: {', '.join(self.runs)}"
            )
        return self.runs[run_id]

    @property
    def history(self) -> Any:
        """Every run's history, one row per run and epoch, led by ``run_id``, ``phase``,
        ``recipe``, ``seed`` and ``lr`` (a DataFrame with pandas, else a list of dicts)."""
        rows, recorded = [], ["run_id", "phase", "recipe", "seed", "lr"]
        for run_id, run in self.runs.items():
            recorded += [k for row in run.recorded for k in row]
            cfg = run.config
            recipe = cfg.model.recipe if model_kind(cfg.model.kind).recipes else None
            head = {"run_id": run_id, "phase": run.dir.phase, "recipe": recipe}
            head |= {"seed": cfg.seed, "lr": cfg.optim.lr}
            rows += [{**head, **row} for row in run.rows]
        return _frame(rows, recorded)

    def status(self) -> list[dict[str, Any]]:
        """Every planned run's state, as ``fathom study status`` prints it."""
        from fathom.study.status import study_status

        return study_status(self.path)[0]

    def __repr__(self) -> str:
        states = [r.status for r in self.runs.values()]
        counts = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))
        return f"Study({self.config.study.name!r}, {str(self.path)!r}, runs: {counts or 'none'})"


def load_study(path: str | Path) -> Study:
    """The study directory at ``path`` (``runs/<study>``, written by ``fathom study run``):
    its recorded config and every run directory in it, each verified (:func:`load_run`)."""
    from fathom.study.studyfile import read_study_file

    path = Path(path)
    if (path / "manifest.json").exists():
        raise FathomError(
            f"{str(path)!r} is a run directory, not a study: load it with "
            f"fathom.load_run({str(path)!r})"
        )
    config = read_study_file(path)
    runs = {}
    for manifest in sorted(path.glob("*/manifest.json")):
        run = Run(_verified(manifest.parent))
        runs[run.run_id] = run
    return Study(path, config, runs)
