"""The typed manifest of a training run (kind ``run``), as :class:`RunWriter` builds and
writes it and :func:`fathom.rundir.manifest.check_manifest` validates it on every read of a
manifest of format 3 or later. Sections: :mod:`fathom.rundir.sections`.

The manifest's top level is open: a section this version does not declare (written by
another kind or tool) is kept and written back unchanged. ``stop``, ``failure``,
``source_changes``, ``recovery`` and ``integrity`` are written only when they hold something
(a run that no target stopped has no ``stop``), every other field always, ``null`` included.
"""

from __future__ import annotations

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
