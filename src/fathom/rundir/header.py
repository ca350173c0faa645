"""The manifest header: the fields of every run directory's ``manifest.json``, any kind.

A manifest is a JSON object (kept as a ``dict`` so that each kind of run adds its own
sections). These fields are the contract every reader relies on, validated by
:class:`ManifestHeader`:

* ``format`` (:data:`FORMAT`), ``run_id``, ``study``;
* ``kind``: which config family ``config`` belongs to (:data:`MANIFEST_KINDS`, see
  :func:`fathom.rundir.reader.config_validator`) -- a field, never parsed from a name;
* ``phase``: the run's role in a study (:data:`PHASES`: a tuning-grid run, a main run, or one
  run of a diagnostic pair such as ``fathom diagnose head``) or ``None`` for a lone run;
* ``status`` (:data:`STATUSES`) and ``status_reason``;
* ``integrity``: ``manifest_sha256`` (SHA-256 of the canonical JSON of the manifest
  without this one key) and ``history`` (``bytes``, ``rows``, ``sha256`` of the first
  ``bytes`` bytes of ``history.jsonl``), checked by every read;
* ``recovery``: a list of what a writer found and repaired (stray temp files, a torn
  history tail, rows past the resume point, a stale lock, a source change), never empty
  of a reason.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fathom.rundir.sections import Integrity, Phase, RecoveryEvent, Status, WeightsEntry

FORMAT = 3
"""The manifest version this fathom writes; it reads every earlier one. Format 3: a manifest
of kind ``run`` is the whole typed :class:`fathom.rundir.record.RunManifest` (validated on
read); formats 1 and 2 are read by their header alone (their other sections free-form)."""
TYPED_FROM = 3
"""The first format whose ``run`` manifests are validated as a whole."""
MANIFEST_KINDS = ("run", "depth_scaling")
PHASES: tuple[str, ...] = get_args(Phase)
STATUSES: tuple[str, ...] = get_args(Status)


class ManifestHeader(BaseModel):
    """The typed contract fields of a manifest (other sections are free-form per kind).

    ``format`` is the manifest version: this fathom writes :data:`FORMAT` and reads every
    earlier one; a later one is refused (written by a newer fathom). The checkpoint entries,
    the selected entry, the recovery events and ``integrity`` are typed, so that a reader
    never meets a half-formed entry (a missing digest) as a ``KeyError`` later.
    """

    model_config = ConfigDict(extra="ignore")

    format: int = Field(le=FORMAT)
    run_id: str
    study: str | None = None
    kind: str
    phase: Phase | None = None
    status: Status
    status_reason: str | None = None
    config: dict[str, Any]
    epochs_completed: int | None = None
    checkpoints: dict[str, WeightsEntry] = Field(default_factory=dict)
    selected_checkpoint: WeightsEntry | None = None
    recovery: list[RecoveryEvent] = Field(default_factory=list)
    integrity: Integrity | None = None

    @field_validator("checkpoints")
    @classmethod
    def _epoch_keys(cls, value: dict[str, WeightsEntry]) -> dict[str, WeightsEntry]:
        bad = [k for k in value if not k.isdigit()]
        if bad:
            raise ValueError(f"checkpoint keys must be epoch numbers, got {bad}")
        return value

    @field_validator("selected_checkpoint")
    @classmethod
    def _selected_epoch(cls, value: WeightsEntry | None) -> WeightsEntry | None:
        if value is not None and value.epoch is None:
            raise ValueError("the selected checkpoint entry lacks its epoch")
        return value
