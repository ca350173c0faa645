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

from pydantic import BaseModel, ConfigDict, ValidationError

from fathom.errors import FathomError
from fathom.io import config_digest

FORMAT = 2
KINDS = ("run", "depth_scaling")
PHASES = ("tuning", "main", "diagnostic")
STATUSES = ("running", "complete", "diverged", "failed")


class ManifestHeader(BaseModel):
    """The contract fields of a manifest (other sections are free-form per kind)."""

    model_config = ConfigDict(extra="ignore")

    format: int
    run_id: str
    study: str | None = None
    kind: str
    phase: Literal["tuning", "main", "diagnostic"] | None = None
    status: Literal["running", "complete", "diverged", "failed"]
    status_reason: str | None = None
    config: dict[str, Any]


def manifest_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``manifest`` without ``integrity.manifest_sha256``."""
    body = copy.deepcopy(manifest)
    (body.get("integrity") or {}).pop("manifest_sha256", None)
    return config_digest(body)


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """Set ``integrity.manifest_sha256`` of ``manifest`` (in place) and return it."""
    manifest.setdefault("integrity", {})["manifest_sha256"] = manifest_digest(manifest)
    return manifest


def check_manifest(manifest: Any, origin: str) -> ManifestHeader:
    """Validate the contract fields and the digest of a parsed manifest, or raise.

    A manifest without ``integrity`` (a hand-made fixture, another tool) is accepted:
    readers report it as unverified (:func:`fathom.rundir.reader.RunDir.problems`).
    """
    if not isinstance(manifest, dict):
        raise FathomError(f"{origin} is not a JSON object; the run cannot be read")
    recorded = (manifest.get("integrity") or {}).get("manifest_sha256")
    if recorded is not None and recorded != manifest_digest(manifest):
        raise FathomError(
            f"{origin} fails its digest check (recorded {recorded}, content hashes to "
            f"{manifest_digest(manifest)}): it was edited or corrupted after fathom wrote it. "
            "Restore the run directory from a copy or retrain the run"
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
