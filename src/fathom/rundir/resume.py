"""What a resume continues from, verified against the run it belongs to.

A resume state (``checkpoints/resume.safetensors``, :func:`fathom.rundir.files.save_resume`) is bound
to its run by :func:`bind`: it records the resume-state format (:data:`RESUME_FORMAT`), the
manifest's ``run_id`` and ``config_hash``, its ``epoch``, and the history it continues from
(``history = {"bytes", "rows", "sha256"}``: the digest of the first ``bytes`` bytes of
``history.jsonl`` when the state was written, i.e. every row up to the resume point). A
resume then checks (:func:`check_binding`, :func:`verified_history`):

* the state belongs to this run (same ``run_id`` and ``config_hash``; a ``checkpoints/``
  copied from an identical run at another learning rate is refused), and its epoch is one the
  manifest can have reached;
* the history rows up to the resume point are the ones written then, byte for byte: a
  changed value, an emptied or deleted history, a deleted, torn or duplicated row among
  them is refused (no verified copy exists to repair it from); rows after the resume point
  are cut and recorded.

A run stopped before its first epoch boundary (no resume state, nothing completed) is
restarted from scratch (:func:`restart_allowed`); a missing resume state of a run with
completed epochs is refused with what is lost.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from fathom.errors import FathomError
from fathom.rundir.filecheck import RESUME_NAME, resume_file
from fathom.rundir.files import load_weights

RESUME_FORMAT = 2
"""Version of the resume state's binding fields (``format``, ``run_id``, ``config_hash``,
``history``); a state without them was written by an older fathom and cannot be verified."""


def history_record(digest: Any, n_bytes: int, rows: int) -> dict[str, Any]:
    """``{"bytes", "rows", "sha256"}`` of a history prefix (``digest``: a running sha256)."""
    return {"bytes": n_bytes, "rows": rows, "sha256": digest.hexdigest()}


def bind(state: dict[str, Any], manifest: dict[str, Any], history: dict[str, Any]) -> dict:
    """``state`` with the fields that bind it to its run and to the history it follows."""
    return {
        **state,
        "format": RESUME_FORMAT,
        "run_id": manifest["run_id"],
        "config_hash": manifest["config_hash"],
        "history": history,
    }


def retrain_advice(run: Path, epochs: int) -> str:
    """What to do when a run cannot continue exactly: what is lost, and how to get it back."""
    if epochs <= 0:
        return f"move {str(run)!r} away and train the run again (no epoch was completed)"
    return (
        f"restore the run directory from a copy, or move {str(run)!r} away and train the run "
        f"again with its config: its {epochs} completed epoch(s) are lost and retrained "
        "(training is deterministic: the final parameters come out the same)"
    )


def check_binding(state: dict[str, Any], manifest: dict[str, Any], path: Path) -> None:
    """Refuse a resume state that is not this run's, or not at an epoch it can be at."""
    where = f"resume state {str(resume_file(path) or path / 'checkpoints')!r}"
    done = int(manifest.get("epochs_completed") or 0)
    if state.get("format") != RESUME_FORMAT:
        raise FathomError(
            f"{where} has no run binding (format {state.get('format')!r}, expected "
            f"{RESUME_FORMAT}): it was written by an older fathom and cannot be verified "
            f"against this run. Resume it with the fathom version that wrote it, or "
            f"{retrain_advice(path, done)}"
        )
    for key in ("run_id", "config_hash"):
        if state.get(key) != manifest.get(key):
            raise FathomError(
                f"{where} belongs to another run: its {key} is {state.get(key)!r}, the "
                f"manifest's {manifest.get(key)!r} (checkpoints/ copied from another run "
                f"directory?). Put this run's own checkpoints/ back, or {retrain_advice(path, done)}"
            )
    epoch = state.get("epoch")
    every = int(((manifest.get("config") or {}).get("checkpoints") or {}).get("resume_every", 1))
    if type(epoch) is not int or not done - every <= epoch <= done + 1:
        raise FathomError(
            f"{where} is at epoch {epoch!r} but the manifest records {done} completed epochs "
            f"(resume state every {every}): the two come from different moments of the run. "
            f"Restore the run directory from a copy, or {retrain_advice(path, done)}"
        )


def source_changed(
    manifest: dict[str, Any], current: str, allow: bool, epoch: int, path: Path
) -> bool:
    """Has the source changed since the run started? Refused unless ``allow``; then
    ``{"from_epoch", "source_hash"}`` is appended to ``manifest["source_changes"]``."""
    recorded = manifest.get("source_hash")
    if recorded is None or recorded == current:
        return False
    if not allow:
        raise FathomError(
            f"the fathom source changed since run {str(path)!r} started (recorded source hash "
            f"{recorded[:12]}…, now {current[:12]}…): resuming would mix two code versions in "
            "one run. Restore the original source, start a new run, or pass "
            "--allow-source-change to continue anyway (recorded in the manifest)"
        )
    changes = list(manifest.get("source_changes") or [])
    manifest["source_changes"] = [*changes, {"from_epoch": epoch, "source_hash": current}]
    return True


def verified_history(data: bytes | None, record: Any, path: Path, epoch: int) -> bytes:
    """The first ``record["bytes"]`` bytes of ``history.jsonl`` (``data``), verified.

    ``data`` is ``None`` when the file is missing. Every row up to the resume point must be
    there as written; otherwise the resume is refused, naming what is wrong.
    """
    if not isinstance(record, dict) or set(record) != {"bytes", "rows", "sha256"}:
        raise FathomError(
            f"resume state of {str(path)!r} has no usable history digest ({record!r}); "
            f"the history it continues from cannot be verified. {retrain_advice(path, epoch)}"
        )
    n, rows = int(record["bytes"]), int(record["rows"])
    if data is None:
        wrong = "history.jsonl is missing"
    elif len(data) < n:
        wrong = f"history.jsonl has {len(data)} bytes, fewer than the {n} of its first {rows} rows"
    elif hashlib.sha256(data[:n]).hexdigest() != record["sha256"]:
        wrong = (
            f"the first {n} bytes of history.jsonl (its {rows} rows up to epoch {epoch}) fail "
            "their digest: a row was changed, removed, duplicated or torn"
        )
    else:
        return data[:n]
    raise FathomError(
        f"cannot resume {str(path)!r}: {wrong}. The rows up to the resume point (epoch {epoch}) "
        "cannot be rebuilt from the checkpoints, and resuming would seal a wrong history as "
        f"complete. Restore history.jsonl from a copy of the run, or {retrain_advice(path, epoch)}"
    )


def restart_allowed(manifest: dict[str, Any], path: Path) -> bool:
    """True when a run without a resume state may start again from scratch; else raise.

    No resume state and no completed epoch: the run stopped inside epoch 0 (evaluation,
    epoch-0 checkpoint) and nothing is lost by training it from the start.
    """
    done = int(manifest.get("epochs_completed") or 0)
    if done == 0 and not any(int(e) > 0 for e in manifest.get("checkpoints") or {}):
        return True
    raise FathomError(
        f"the resume state checkpoints/{RESUME_NAME} of {str(path)!r} is missing although the "
        f"manifest records {done} completed epoch(s): it was deleted or lost. The epoch "
        "checkpoints hold weights only, not the optimizer, generator and RNG states an exact "
        f"resume needs: {retrain_advice(path, done)}"
    )


def check_selected(rd: Any, entry: dict[str, Any] | None, epoch: int) -> int | None:
    """Verify the selected weights a resume state lists; ``None``, or the later epoch the
    file legitimately holds (:func:`newer_selected`), which the replayed epochs rewrite."""
    if not entry:
        return None
    try:
        rd.verify_entry(entry)
        return None
    except FathomError:
        _state, meta = load_weights(rd.path / entry["file"])
    if not newer_selected(meta, rd.manifest, entry):
        raise FathomError(
            f"checkpoint {entry['file']!r} of run {str(rd.path)!r} holds epoch "
            f"{meta.get('epoch')}, not the selected epoch {entry['epoch']} of the resume state "
            "nor a later one of this run: the run directory was modified; "
            f"{retrain_advice(rd.path, epoch)}"
        )
    return int(meta["epoch"])


def newer_selected(meta: dict[str, str], manifest: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Is a self-verifying ``selected.safetensors`` (metadata ``meta``) a legitimate later
    selection than ``entry``, written by the epoch in flight when the run was stopped?

    The selected weights are rewritten whenever validation CE improves, before the epoch's
    manifest commit: after a kill the file may hold a later epoch of the same run.
    """
    try:
        later = int(meta.get("epoch", -1))
    except ValueError:
        return False
    return (
        later > int(entry.get("epoch", -1))
        and meta.get("selected") == "1"
        and meta.get("config_hash") == manifest.get("config_hash")
        and meta.get("run_id") == manifest.get("run_id")
    )


RESTART_REASON = (
    "no resume state and no completed epoch: the run was stopped inside epoch 0 "
    "(evaluation or epoch-0 checkpoint) and is trained again from the start"
)

#: The manifest fields a resumed run must find unchanged: the data it trains on (file
#: contents, split, and the split tensors' digest) and the thread count (CPU reductions,
#: hence the parameters, depend on it). ``(section, key)`` pairs.
UNCHANGED_ON_RESUME = (
    ("data", "files"),
    ("data", "split_hash"),
    ("data", "sizes"),
    ("data", "tensors_sha256"),
    ("environment", "threads"),
)


def unchanged_inputs(recorded: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    """Refuse to continue when an input in :data:`UNCHANGED_ON_RESUME` changed.

    A key the recorded manifest lacks (written before it was recorded) is not compared.
    """
    changed = []
    for section, key in UNCHANGED_ON_RESUME:
        before = (recorded.get(section) or {}).get(key)
        after = (current.get(section) or {}).get(key)
        if key in (recorded.get(section) or {}) and before != after:
            changed.append(f"{section}.{key} recorded {_short(before)}, now {_short(after)}")
    if changed:
        raise FathomError(
            f"cannot resume {str(path)!r}: what it trains with changed since it started "
            f"({'; '.join(changed)}); continuing would mix two inputs in one run. Restore the "
            "original dataset files (and thread count), or start a new run. A run trained on "
            "data given in memory (`train(cfg, dir, splits=...)`) is resumed with the same "
            "data (`resume(dir, splits=...)`)"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 90 else text[:87] + "..."
