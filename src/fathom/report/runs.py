"""Runs as reports and exports see them: manifest, history rows, flagged lines, cohort.

Everything here is read from run directories (``fathom.rundir``), never from a
trainer. A history line that was truncated or does not parse is *flagged* (its line
number kept) and left out; a row without an integer ``epoch`` or repeating an epoch
is flagged the same way. The remaining rows are sorted by epoch.

A run's state (:func:`fathom.rundir.run_state`: running while a live process holds its lock,
interrupted, or its outcome) travels with it, so every output of a run that is not finished
says so (:func:`unfinished`): ``running, 3 of 10 epochs``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from fathom.base.io import sha256_file
from fathom.errors import FathomError
from fathom.rundir import RunDir, RunState, find_runs, run_state
from fathom.rundir.manifest import read_recorded
from fathom.rundir.record import RecordedRun


@dataclass
class RunData:
    """One run directory reduced to what a report or export needs. Its manifest is read
    through :attr:`recorded` (typed, any format); ``manifest`` is the object as written, for
    the views that show a section verbatim (the provenance table, the W&B config)."""

    path: Path
    run_id: str
    manifest: dict[str, Any]
    rows: list[dict[str, Any]]
    flagged_lines: list[int] = field(default_factory=list)
    flag_reasons: list[str] = field(default_factory=list)
    history_sha256: str | None = None
    recovery: list[str] = field(default_factory=list)  # what writers repaired (RunDir)
    state: RunState | None = None  # read with the run (None: a run made by hand, in tests)

    @cached_property
    def recorded(self) -> RecordedRun:
        """The manifest, typed (:class:`~fathom.rundir.record.RecordedRun`, the one read path
        of every format; a section of the wrong shape is refused naming it)."""
        manifest = {**self.manifest, "run_id": self.run_id}
        return read_recorded(manifest, f"the manifest of run {self.run_id!r}")

    @property
    def config(self) -> Mapping[str, Any]:
        """The config as recorded, unvalidated (``{}`` where none is)."""
        return self.recorded.config.as_json()

    @property
    def recipe(self) -> str:
        model = self.recorded.config.model
        return str(model.recipe) if "recipe" in model.given() else "unknown"

    @property
    def lr(self) -> float | None:
        return self.recorded.config.optim.lr

    @property
    def seed(self) -> int | None:
        return self.recorded.config.seed

    @property
    def phase(self) -> str | None:
        """``tuning`` for a study's tuning-grid run (the manifest's ``phase``), else ``None``."""
        return "tuning" if self.recorded.phase == "tuning" else None

    @property
    def cohort(self) -> str:
        """Recipe and learning rate (and phase): runs that differ only by seed share a cohort."""
        name = self.recipe if self.lr is None else f"{self.recipe} lr={self.lr:g}"
        return name if self.phase is None else f"{name} ({self.phase})"

    @property
    def status(self) -> str | None:
        """The run's status as said (:class:`~fathom.rundir.RunState`), else the manifest's."""
        return self.state.status if self.state is not None else self.recorded.status

    def metadata(self) -> dict[str, Any]:
        """The run-level facts every exported row carries (``state``: ``running, 3 of 10
        epochs (...)`` for a run being trained, ``complete, 10 of 10 epochs``)."""
        m = self.recorded
        return {
            "run_id": self.run_id,
            "study": m.study,
            "status": self.status,
            "state": self.state.sentence() if self.state is not None else None,
            "recipe": self.recipe,
            "lr": self.lr,
            "seed": self.seed,
            "cohort": self.cohort,
            "config_hash": m.config_hash,
            "source_hash": m.source_hash,
            "history_sha256": self.history_sha256,
            "flagged_lines": list(self.flagged_lines),
        }


def _clean_rows(
    raw: list[dict[str, Any]], bad: list[int]
) -> tuple[list[dict[str, Any]], list[str]]:
    reasons = [f"history line {n} is truncated or does not parse" for n in bad]
    by_epoch: dict[int, dict[str, Any]] = {}
    for i, row in enumerate(raw):
        epoch = row.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            reasons.append(f"history row {i + 1} has no integer epoch ({epoch!r}); left out")
            continue
        if epoch in by_epoch:
            reasons.append(f"history repeats epoch {epoch}; the later row is kept")
        by_epoch[epoch] = row
    return [by_epoch[e] for e in sorted(by_epoch)], reasons


def run_data(rd: RunDir) -> RunData:
    """A run as reports see it; integrity problems (torn history, a checkpoint failing its
    digest, a leftover temp file) are flagged, never read around silently."""
    hist = rd.path / "history.jsonl"
    raw, bad = rd.history_with_errors()
    rows, reasons = _clean_rows(raw, bad)
    reasons += [p for p in rd.problems(deep=True) if " is torn " not in p]  # torn: listed above
    run = RunData(
        path=rd.path,
        run_id=rd.run_id,
        manifest=rd.manifest,
        rows=rows,
        flagged_lines=list(bad),
        flag_reasons=reasons,
        history_sha256=sha256_file(hist) if hist.exists() else None,
        recovery=rd.recovery_notes(),
        state=run_state(rd),
    )
    run.recorded = rd.recorded  # the reader's own, parsed once
    return run


def unfinished(runs: list[RunData]) -> list[str]:
    """``"<run id>: running, 3 of 10 epochs (...)"`` for each run without its final result
    (running or interrupted): what every report and export says beside its output."""
    return [
        f"{r.run_id}: {r.state.sentence()}"
        for r in runs
        if r.state is not None and not r.state.finished
    ]


def load_runs(root: str | Path) -> list[RunData]:
    """Every run at or below ``root``, or a FathomError naming the directory and the fix."""
    root = Path(root)
    if not root.exists():
        raise FathomError(
            f"{str(root)!r} does not exist; pass a run directory or a study directory"
        )
    runs = [run_data(r) for r in find_runs(root)]
    if not runs:
        raise FathomError(
            f"no runs under {str(root)!r} (no manifest.json with a history.jsonl beside it); "
            "pass a directory written by `fathom train` or `fathom study run`"
        )
    ids = [r.run_id for r in runs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise FathomError(
            f"run ids {dup} occur more than once under {str(root)!r}; report or export one "
            "study directory at a time (or rename the copies)"
        )
    return runs


def _is_scalar(value: Any) -> bool:
    """A number a curve can plot: int or float (bool excluded); ``None`` counts as a gap."""
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def scalar_fields(runs: list[RunData]) -> list[str]:
    """Fields whose every recorded value is a number or null, in first-seen order."""
    seen: dict[str, bool] = {}
    for run in runs:
        for row in run.rows:
            for k, v in row.items():
                seen[k] = seen.get(k, True) and _is_scalar(v)
    return [k for k, ok in seen.items() if ok]


def widest_first(runs: list[RunData]) -> list[RunData]:
    """Runs ordered by how many distinct fields they record, most first (stable), so that
    first-seen field order follows the largest model's layer order."""
    width = {id(r): len({k for row in r.rows for k in row}) for r in runs}
    return sorted(runs, key=lambda r: -width[id(r)])


def nonfinite_name(value: float) -> str | None:
    """``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` for a non-finite float (W&B's spelling)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return None
