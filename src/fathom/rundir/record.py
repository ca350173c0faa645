"""The typed manifest of a training run (kind ``run``), as :class:`RunWriter` builds and
writes it and :func:`fathom.rundir.manifest.check_manifest` validates it on every read of a
manifest of format 3 or later. Sections: :mod:`fathom.rundir.sections`.
Also the typed records of a run's other JSON outputs: :class:`CurvatureRecord` and
:class:`AuditRecord` (read by :func:`fathom.rundir.reader.read_curvature` and
:func:`fathom.rundir.reader.read_audit`).

The manifest's top level is open: a section this version does not declare (written by
another kind or tool) is kept and written back unchanged. ``stop``, ``failure``,
``source_changes``, ``recovery`` and ``integrity`` are written only when they hold something
(a run that no target stopped has no ``stop``), every other field always, ``null`` included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field

from fathom.rundir.header import ManifestHeader
from fathom.rundir.sections import (
    Clocks,
    Data,
    Environment,
    Execution,
    Failure,
    Final,
    Hashes,
    Integrity,
    Live,
    ModelRecord,
    Selected,
    SourceChange,
    Stop,
    Telemetry,
)

#: Sections written only when set (see the module docstring).
WRITTEN_WHEN_SET = ("stop", "failure", "source_changes", "recovery", "integrity")


class RunManifest(ManifestHeader):
    """Everything a training run's ``manifest.json`` holds (``docs/architecture.md``).

    Beyond the header (format, kind, phase, run_id, study, status and its reason, config,
    checkpoint entries, recovery events): ``config_hash`` (:func:`fathom.base.io.config_digest` of
    ``config``), ``source_hash`` (of the fathom source the run started with; later ones in
    ``source_changes``), ``data``, ``model``, ``hashes``, ``environment``, ``clocks``,
    ``epochs_completed`` / ``steps_completed`` (at the last complete epoch boundary),
    ``diverged_epoch`` (the epoch whose loss or parameters went non-finite, else ``null``),
    ``selected``, ``final``, ``telemetry``, ``live``, ``execution``, ``stop`` and
    ``failure``.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    kind: str = "run"
    config_hash: str
    source_hash: str | None
    source_changes: list[SourceChange] | None = None
    failure: Failure | None = None
    data: Data
    model: ModelRecord
    hashes: Hashes
    environment: Environment
    clocks: Clocks = Field(default_factory=Clocks)
    epochs_completed: int = 0
    steps_completed: int = 0
    diverged_epoch: int | None = None
    selected: Selected = Field(default_factory=Selected)
    final: Final = Field(default_factory=Final)
    telemetry: Telemetry
    live: Live = Field(default_factory=Live)
    execution: Execution
    stop: Stop | None = None
    integrity: Integrity | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object written to ``manifest.json`` (without ``integrity``: the writer seals
        it), unknown top-level sections included."""
        out = self.model_dump(mode="json", by_alias=True, exclude={"integrity"})
        for key in WRITTEN_WHEN_SET:
            if out.get(key) in (None, []):
                out.pop(key, None)
        return out


@dataclass(frozen=True)
class CurvatureSummary:
    """``<run>/curvature/summary.json`` (:func:`fathom.curvature.rundir.run_curvature` writes
    it): the probe ``scope`` (split, ``N``, probe digest), the ``normalization`` sentence and one
    row per snapshot (``rows``, each with its ``epoch``). ``raw`` is the file's object, unchanged
    (keys this version does not name included)."""

    run_id: str
    rows: list[dict[str, Any]]
    scope: dict[str, Any]
    normalization: Any
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CurvatureSummary:
        return cls(
            run_id=data.get("run_id", ""),
            rows=list(data.get("rows", [])),
            scope=dict(data.get("scope", {})),
            normalization=data.get("normalization"),
            raw=data,
        )

    def by_epoch(self) -> dict[int, dict[str, Any]]:
        """``{epoch: row}`` of :attr:`rows`."""
        return {int(r["epoch"]): r for r in self.rows}


@dataclass(frozen=True)
class CurvatureRecord:
    """A run's curvature directory: ``summary`` (``None`` when ``summary.json`` is absent or
    unreadable) and ``epochs`` (``{epoch: epoch-NNNN.json object}``, the snapshots present)."""

    summary: CurvatureSummary | None
    epochs: dict[int, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        """``{"summary": summary.json object or None, "epochs": {epoch: object}}``."""
        return {
            "summary": None if self.summary is None else self.summary.raw,
            "epochs": self.epochs,
        }


@dataclass(frozen=True)
class AuditRecord:
    """``audit/audit.json`` of a run or study (:func:`fathom.audit.run.audit_runs` writes it):
    ``kind`` (``run`` or ``study``), the audited ``target``, ``settings``, per-run ``runs``
    tables, ``skipped`` runs, ``aggregate`` (across seeds, per checkpoint) and ``wall_s``.
    ``raw`` is the file's object, unchanged (what the renderers take)."""

    kind: str
    target: str
    settings: dict[str, Any]
    runs: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    aggregate: dict[str, Any]
    wall_s: float | None
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditRecord:
        return cls(
            kind=data.get("kind", "study"),
            target=data.get("target", ""),
            settings=dict(data.get("settings", {})),
            runs=list(data.get("runs", [])),
            skipped=list(data.get("skipped", [])),
            aggregate=dict(data.get("aggregate", {})),
            wall_s=data.get("wall_s"),
            raw=data,
        )
