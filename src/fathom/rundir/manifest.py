"""A manifest's digest, its ``integrity`` section, the one validator and recovery events.

The fields are typed in :mod:`fathom.rundir.header` (the contract every reader relies on,
any kind and format) and :mod:`fathom.rundir.record` (a training run's whole manifest,
validated for format 3 on). :func:`check_manifest` is the one validator: the writer runs it
on what it is about to write, every reader on what it read.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError

from fathom.base.io import config_digest
from fathom.errors import FathomError
from fathom.rundir.header import FORMAT, TYPED_FROM, ManifestHeader
from fathom.rundir.record import RecordedRun, RunManifest


def _manifest_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``manifest`` without ``integrity.manifest_sha256``."""
    body = copy.deepcopy(manifest)
    (body.get("integrity") or {}).pop("manifest_sha256", None)
    return config_digest(body)


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """Set ``integrity.manifest_sha256`` of ``manifest`` (in place) and return it."""
    manifest.setdefault("integrity", {})["manifest_sha256"] = _manifest_digest(manifest)
    return manifest


#: The keys of ``integrity`` and of its ``history`` record, exactly: a renamed or missing key
#: would switch a check off, so it is refused (:func:`_integrity_problems`).
_INTEGRITY_KEYS = frozenset({"manifest_sha256", "history"})
_HISTORY_KEYS = frozenset({"bytes", "rows", "sha256"})


def _integrity_problems(manifest: dict[str, Any]) -> list[str]:
    """What is malformed in ``manifest["integrity"]`` (empty: well-formed or absent).

    Absent altogether (a hand-made fixture) is not malformed: readers report it as
    unverified. Present, it must hold exactly :data:`_INTEGRITY_KEYS`, and ``history``
    exactly :data:`_HISTORY_KEYS` (two non-negative integers and a SHA-256 hex digest).
    """
    if "integrity" not in manifest:
        return []
    integrity = manifest["integrity"]
    if not isinstance(integrity, dict):
        return [f"integrity is a {type(integrity).__name__}, not an object"]
    out = _keys_problems("integrity", integrity, _INTEGRITY_KEYS)
    history = integrity.get("history")
    if "history" in integrity and not isinstance(history, dict):
        out.append(f"integrity.history is a {type(history).__name__}, not an object")
    elif isinstance(history, dict):
        out += _keys_problems("integrity.history", history, _HISTORY_KEYS)
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
    """Validate the digest and the fields of a parsed manifest, or raise; return its type.

    A ``run`` manifest of format :data:`~fathom.rundir.header.TYPED_FROM` or later is
    validated as a whole (:class:`~fathom.rundir.record.RunManifest`); an earlier one, or
    one of another kind, by its header (:class:`~fathom.rundir.header.ManifestHeader`).

    A manifest without ``integrity`` (a hand-made fixture, another tool) is accepted:
    readers report it as unverified (:func:`fathom.rundir.reader.RunDir.problems`). A
    malformed ``integrity`` section (:func:`_integrity_problems`) is refused: a renamed
    digest key must not switch verification off.
    """
    if not isinstance(manifest, dict):
        raise FathomError(f"{origin} is not a JSON object; the run cannot be read")
    malformed = _integrity_problems(manifest)
    if malformed:
        raise FathomError(
            f"{origin} cannot be verified: {'; '.join(malformed)}. Its digests were renamed, "
            "removed or corrupted after fathom wrote it; restore the run directory from a copy "
            "or retrain the run"
        )
    recorded = (manifest.get("integrity") or {}).get("manifest_sha256")
    if recorded is not None and recorded != _manifest_digest(manifest):
        raise FathomError(
            f"{origin} fails its digest check (recorded {recorded}, content hashes to "
            f"{_manifest_digest(manifest)}): it was edited or corrupted after fathom wrote it. "
            "Restore the run directory from a copy or retrain the run"
        )
    version = manifest.get("format")
    if isinstance(version, int) and version > FORMAT:
        raise FathomError(
            f"{origin} has manifest format {version}, written by a newer fathom (this one reads "
            f"formats up to {FORMAT}); read it with that version or upgrade fathom"
        )
    data = {"kind": "run", **manifest} if "kind" not in manifest else manifest
    typed = data["kind"] == "run" and isinstance(version, int) and version >= TYPED_FROM
    try:
        return (RunManifest if typed else ManifestHeader).model_validate(data)
    except ValidationError as e:
        raise _invalid(origin, e) from None


def read_recorded(manifest: dict[str, Any], origin: str) -> RecordedRun:
    """The fields a resume and an analysis compare (:class:`~fathom.rundir.record.RecordedRun`)
    of a manifest :func:`check_manifest` accepted, whatever its format: the one read path of
    an older (format 1 or 2) manifest, whose sections are free-form. A section of the wrong
    shape is refused naming it, never read around."""
    try:
        return RecordedRun.model_validate(manifest)
    except ValidationError as e:
        raise _invalid(origin, e) from None


def _invalid(origin: str, e: ValidationError) -> FathomError:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
    )
    return FathomError(
        f"{origin} is not a valid manifest ({problems}); it was damaged or written by another "
        "tool: restore the run directory from a copy or retrain the run"
    )


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
    "resume_state_converted": "converted the resume state of an older fathom from {old} "
    "(read by torch's weights-only unpickler) to {new}",
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
