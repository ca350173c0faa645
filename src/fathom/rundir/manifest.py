"""The manifest type: what every run directory's ``manifest.json`` holds, and its digest.

A manifest is a JSON object (kept as a ``dict`` so that each kind of run adds its own
sections). These fields are the contract every reader relies on, validated by
:class:`ManifestHeader`:

* ``format`` (:data:`FORMAT`), ``run_id``, ``study``;
* ``kind``: which config family ``config`` belongs to (:data:`KINDS`, see
  :mod:`fathom.rundir.kinds`) -- a field, never parsed from a name;
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

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fathom.errors import FathomError
from fathom.io import config_digest

FORMAT = 2
KINDS = ("run", "depth_scaling")
PHASES = ("tuning", "main", "diagnostic")
STATUSES = ("running", "complete", "diverged", "failed")


class WeightsEntry(BaseModel):
    """A weights file the manifest lists: ``file`` (relative to the run), ``params_sha256``
    (:func:`fathom.io.state_dict_digest` of its tensors), ``sha256`` of the whole file
    (absent in manifests written before it was recorded) and, for the selected weights,
    ``epoch``."""

    model_config = ConfigDict(extra="allow")

    file: str
    params_sha256: str
    sha256: str | None = None
    epoch: int | None = None


class RecoveryEvent(BaseModel):
    """One thing a writer found and repaired: ``event`` and its details (see
    :data:`RECOVERY_SENTENCES`)."""

    model_config = ConfigDict(extra="allow")

    event: str


class ManifestHeader(BaseModel):
    """The typed contract fields of a manifest (other sections are free-form per kind).

    ``format`` is the manifest version: this fathom writes :data:`FORMAT` and reads every
    earlier one; a later one is refused (written by a newer fathom). The checkpoint entries,
    the selected entry and the recovery events are typed, so that a reader never meets a
    half-formed entry (a missing digest) as a ``KeyError`` later.
    """

    model_config = ConfigDict(extra="ignore")

    format: int = Field(le=FORMAT)
    run_id: str
    study: str | None = None
    kind: str
    phase: Literal["tuning", "main", "diagnostic"] | None = None
    status: Literal["running", "complete", "diverged", "failed"]
    status_reason: str | None = None
    config: dict[str, Any]
    epochs_completed: int | None = None
    checkpoints: dict[str, WeightsEntry] = Field(default_factory=dict)
    selected_checkpoint: WeightsEntry | None = None
    recovery: list[RecoveryEvent] = Field(default_factory=list)

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


def manifest_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``manifest`` without ``integrity.manifest_sha256``."""
    body = copy.deepcopy(manifest)
    (body.get("integrity") or {}).pop("manifest_sha256", None)
    return config_digest(body)


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """Set ``integrity.manifest_sha256`` of ``manifest`` (in place) and return it."""
    manifest.setdefault("integrity", {})["manifest_sha256"] = manifest_digest(manifest)
    return manifest


#: The keys of ``integrity`` and of its ``history`` record, exactly: a renamed or missing key
#: would switch a check off, so it is refused (:func:`integrity_problems`).
INTEGRITY_KEYS = frozenset({"manifest_sha256", "history"})
HISTORY_KEYS = frozenset({"bytes", "rows", "sha256"})


def integrity_problems(manifest: dict[str, Any]) -> list[str]:
    """What is malformed in ``manifest["integrity"]`` (empty: well-formed or absent).

    Absent altogether (a hand-made fixture) is not malformed: readers report it as
    unverified. Present, it must hold exactly :data:`INTEGRITY_KEYS`, and ``history``
    exactly :data:`HISTORY_KEYS` (two non-negative integers and a SHA-256 hex digest).
    """
    if "integrity" not in manifest:
        return []
    integrity = manifest["integrity"]
    if not isinstance(integrity, dict):
        return [f"integrity is a {type(integrity).__name__}, not an object"]
    out = _keys_problems("integrity", integrity, INTEGRITY_KEYS)
    history = integrity.get("history")
    if "history" in integrity and not isinstance(history, dict):
        out.append(f"integrity.history is a {type(history).__name__}, not an object")
    elif isinstance(history, dict):
        out += _keys_problems("integrity.history", history, HISTORY_KEYS)
        for key in ("bytes", "rows"):
            value = history.get(key)
            if key in history and (type(value) is not int or value < 0):
                out.append(f"integrity.history.{key} is {value!r}, not a byte/row count")
        digest = history.get("sha256")
        if "sha256" in history and not _is_sha256(digest):
            out.append(f"integrity.history.sha256 is {digest!r}, not a SHA-256 digest")
    return out


def _keys_problems(where: str, section: dict[str, Any], expected: frozenset[str]) -> list[str]:
    unknown, missing = sorted(set(section) - expected), sorted(expected - set(section))
    return [f"{where} has unknown key {k!r}" for k in unknown] + [
        f"{where} lacks key {k!r}" for k in missing
    ]


def _is_sha256(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


def check_manifest(manifest: Any, origin: str) -> ManifestHeader:
    """Validate the contract fields and the digest of a parsed manifest, or raise.

    A manifest without ``integrity`` (a hand-made fixture, another tool) is accepted:
    readers report it as unverified (:func:`fathom.rundir.reader.RunDir.problems`). A
    malformed ``integrity`` section (:func:`integrity_problems`) is refused: a renamed
    digest key must not switch verification off.
    """
    if not isinstance(manifest, dict):
        raise FathomError(f"{origin} is not a JSON object; the run cannot be read")
    malformed = integrity_problems(manifest)
    if malformed:
        raise FathomError(
            f"{origin} cannot be verified: {'; '.join(malformed)}. Its digests were renamed, "
            "removed or corrupted after fathom wrote it; restore the run directory from a copy "
            "or retrain the run"
        )
    recorded = (manifest.get("integrity") or {}).get("manifest_sha256")
    if recorded is not None and recorded != manifest_digest(manifest):
        raise FathomError(
            f"{origin} fails its digest check (recorded {recorded}, content hashes to "
            f"{manifest_digest(manifest)}): it was edited or corrupted after fathom wrote it. "
            "Restore the run directory from a copy or retrain the run"
        )
    version = manifest.get("format")
    if isinstance(version, int) and version > FORMAT:
        raise FathomError(
            f"{origin} has manifest format {version}, written by a newer fathom (this one reads "
            f"formats up to {FORMAT}); read it with that version or upgrade fathom"
        )
    data = {"kind": "run", **manifest} if "kind" not in manifest else manifest
    try:
        return ManifestHeader.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise FathomError(f"{origin} is not a valid manifest ({problems})") from None


def note_recovery(manifest: dict[str, Any], event: str, **details: Any) -> None:
    """Append ``{"event", **details}`` to ``manifest["recovery"]`` (what a writer repaired)."""
    manifest.setdefault("recovery", []).append({"event": event, **details})


#: One sentence per ``recovery`` event, formatted with its details (``docs/architecture.md``).
RECOVERY_SENTENCES = {
    "stale_lock_taken_over": "took over the lock of a dead writer (PID {pid})",
    "removed_temp_files": "removed leftovers of killed writes: {files}",
    "history_lines_unreadable": "history lines {lines} were torn; cut when resuming from "
    "epoch {resumed_from}",
    "history_truncated": "history rows of epochs {dropped_epochs} after the resume point were "
    "cut (resumed from epoch {to_epoch}) and written again",
    "selected_beyond_resume_point": "selected weights of epoch {epoch}, newer than the resume "
    "point (epoch {resume}), were rewritten by the replayed epochs",
    "source_changed": "the fathom source changed from epoch {from_epoch} on (source hash "
    "{source_hash}; --allow-source-change)",
    "restarted": "started again from scratch: {reason} (status found: {found})",
    "threads_set_to_recorded": "resumed with the recorded {recorded} thread(s) instead of the "
    "{found} found",
}


def describe_recovery(event: dict[str, Any]) -> str:
    """The sentence for one ``recovery`` event (:data:`RECOVERY_SENTENCES`); an event this
    version does not know is shown with its raw details, never dropped."""
    details = {k: v for k, v in event.items() if k != "event"}
    template = RECOVERY_SENTENCES.get(str(event.get("event")))
    try:
        return template.format(**details) if template else f"{event.get('event')}: {details}"
    except (KeyError, IndexError, ValueError):
        return f"{event.get('event')}: {details}"
