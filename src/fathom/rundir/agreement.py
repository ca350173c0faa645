"""A resume state agrees with the manifest's own record of the run, or is refused.

:func:`fathom.rundir.resume.check_binding` ties a resume state to a run by ``run_id`` and
``config_hash``; a *twin* (the same config and run id, trained with another thread count, on
another device, or on other data given in memory) has both. Its ``checkpoints/`` and
``history.jsonl``, copied into an interrupted run, verify against each other, and a resume
would continue the twin's numbers under this run's manifest. :func:`verify_against_manifest`
compares what the state continues from with what the manifest recorded itself:

* **what it was computed with**: the state carries :func:`manifest_record` of the manifest it
  was written under (:data:`BOUND_FIELDS`: thread count, device, matmul precision, the data's
  content and split digests, the initial parameters); each must equal the manifest's;
* **the history**: the manifest seals the first ``integrity.history.bytes`` bytes of
  ``history.jsonl``; those bytes (when the file still holds them) must hash to its digest, so
  the rows the state continues from are the ones this manifest recorded;
* **the checkpoint entries**: an epoch checkpoint both list is the same file (``file``,
  ``params_sha256``, ``sha256``); one the manifest lists at or before the state's epoch is
  listed by the state, and one only the state lists is after the manifest's last commit
  (the first commit, at epoch 0, precedes epoch 0's checkpoint);
  the selected weights of one epoch are the same entry;
* **the progress** at the manifest's own epoch: step count, training-order and mask digests.

The manifest's epoch ``done`` and the state's epoch ``e`` may differ legitimately: ``e <
done`` with ``checkpoints.resume_every > 1``, ``e = done + 1`` after a kill between the
state's write and the manifest's commit; each check compares only what both recorded.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from fathom.errors import FathomError
from fathom.rundir.resume import retrain_advice

RECORD_KEY = "manifest_record"
"""The resume state's key holding :func:`manifest_record` of the manifest it was written under."""

BOUND_FIELDS: tuple[tuple[str, str], ...] = (
    ("environment", "threads"),
    ("environment", "device"),
    ("environment", "matmul_precision"),
    ("data", "tensors_sha256"),
    ("data", "split_hash"),
    ("hashes", "initial_params"),
)
"""``(section, key)`` of the manifest that a resume state must have been computed with: CPU
reductions depend on the thread count, kernels on the device and matmul precision, every
step on the data and the initial parameters."""

PROGRESS_AT_DONE = (
    ("step", "steps_completed", None),
    ("order_digest", "training_order", "hashes"),
    ("mask_digest", "masks", "hashes"),
)
"""``(state key, manifest key, manifest section)`` equal when the state is at the manifest's
epoch: the state and the commit of one epoch boundary record the same progress."""


def manifest_record(manifest: dict[str, Any]) -> dict[str, Any]:
    """``{"section.key": value}`` of :data:`BOUND_FIELDS` in ``manifest`` (JSON values)."""
    out = {}
    for section, key in BOUND_FIELDS:
        values = manifest.get(section) or {}
        if key in values:
            out[f"{section}.{key}"] = values[key]
    return out


def verify_against_manifest(
    state: dict[str, Any], manifest: dict[str, Any], history: bytes | None, path: Path
) -> None:
    """Refuse a resume state (and the history and checkpoints it continues from) that the
    manifest of ``path`` did not record; see the module docstring for what is compared."""
    _check_record(state, manifest, path)
    _check_history(state, manifest, history, path)
    _check_checkpoints(state, manifest, path)
    _check_progress(state, manifest, path)


def _refuse(path: Path, manifest: dict[str, Any], what: str) -> FathomError:
    done = int(manifest.get("epochs_completed") or 0)
    return FathomError(
        f"the resume state of run {str(path)!r} is not the one its manifest recorded: {what}. "
        "checkpoints/ or history.jsonl come from another "
        "run (a twin with the same config and run id, trained with another thread count, "
        "device or data?) or from another moment of this one, and continuing would mix two "
        f"runs under one manifest. Put this run's own checkpoints/ and history.jsonl back, or "
        f"{retrain_advice(path, done)}"
    )


def _check_record(state: dict[str, Any], manifest: dict[str, Any], path: Path) -> None:
    recorded = state.get(RECORD_KEY)
    if recorded is None:  # written before states carried it: the other checks still apply
        return
    ours = manifest_record(manifest)
    if not isinstance(recorded, dict):
        raise _refuse(path, manifest, f"the resume state's {RECORD_KEY} is not a table")
    for name, value in recorded.items():
        if name in ours and ours[name] != value:
            raise _refuse(
                path,
                manifest,
                f"the resume state was computed with {name} = {value!r}, the manifest "
                f"records {ours[name]!r}",
            )


def _check_history(
    state: dict[str, Any], manifest: dict[str, Any], history: bytes | None, path: Path
) -> None:
    sealed = (manifest.get("integrity") or {}).get("history") or {}
    n = sealed.get("bytes")
    if history is None or not isinstance(n, int) or len(history) < n:
        return  # the state's own digest decides (a cut history of an earlier resume)
    if hashlib.sha256(history[:n]).hexdigest() != sealed.get("sha256"):
        rows = sealed.get("rows")
        raise _refuse(
            path,
            manifest,
            f"the first {n} bytes of history.jsonl (the {rows} rows the manifest sealed at "
            f"epoch {manifest.get('epochs_completed')}) are not the ones it recorded",
        )


def _check_checkpoints(state: dict[str, Any], manifest: dict[str, Any], path: Path) -> None:
    ours = manifest.get("checkpoints") or {}
    theirs = state.get("checkpoints") or {}
    done, epoch = int(manifest.get("epochs_completed") or 0), int(state["epoch"])
    for key in sorted({*ours, *theirs}, key=int):
        mine, other = ours.get(key), theirs.get(key)
        if mine is not None and other is not None:
            same = _same(mine, other)
        elif other is None:  # only a checkpoint of an epoch the state has not reached
            same = int(key) > epoch
        else:  # or one after the manifest's last commit (the first precedes epoch 0's)
            same = int(key) > done or int(key) == done == 0
        if not same:
            raise _refuse(
                path,
                manifest,
                f"the resume state lists checkpoint {_entry(other)} for epoch {key}, the "
                f"manifest {_entry(mine)}",
            )
    sel, ours_sel = state.get("selected_ckpt"), manifest.get("selected_checkpoint")
    if sel and ours_sel and sel.get("epoch") == ours_sel.get("epoch") and not _same(sel, ours_sel):
        raise _refuse(
            path,
            manifest,
            f"the resume state's selected weights of epoch {sel.get('epoch')} are "
            f"{_entry(sel)}, the manifest's {_entry(ours_sel)}",
        )


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Do two weights entries name the same file with the same digests?"""
    return all(a.get(k) == b.get(k) for k in ("file", "params_sha256", "sha256"))


def _entry(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "none"
    return f"{entry.get('file')!r} (sha256 {str(entry.get('sha256'))[:12]}…)"


def _check_progress(state: dict[str, Any], manifest: dict[str, Any], path: Path) -> None:
    if int(state["epoch"]) != int(manifest.get("epochs_completed") or 0):
        return
    for key, recorded, section in PROGRESS_AT_DONE:
        ours = (manifest.get(section) or {}) if section else manifest
        if recorded in ours and ours[recorded] is not None and ours[recorded] != state.get(key):
            name = f"{section}.{recorded}" if section else recorded
            raise _refuse(
                path,
                manifest,
                f"the resume state at epoch {state['epoch']} has {key} {state.get(key)!r}, "
                f"the manifest's {name} at that epoch is {ours[recorded]!r}",
            )
