"""What a resume continues from, verified against the run it belongs to.

A resume state (``checkpoints/resume.safetensors``, :func:`fathom.rundir.files.save_resume`) is bound
to its run by :func:`bind`: it records the resume-state format (:data:`_RESUME_FORMAT`), the
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

**Agreement with the manifest's own record** (:func:`verify_against_manifest`). A *twin* (the
same config and run id, trained with another thread count, on another device, or on other
data given in memory) passes the binding. Its ``checkpoints/`` and ``history.jsonl``, copied
into an interrupted run, verify against each other, and a resume would continue the twin's
numbers under this run's manifest. So what the state continues from is compared with what
the manifest recorded itself:

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

The manifest is read through :class:`~fathom.rundir.record.RecordedRun` (``RunDir.recorded``),
whatever its format: a field an older manifest lacks (written before it was recorded) is
not compared.

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
from fathom.rundir.record import RecordedRun
from fathom.rundir.sections import SourceChange, WeightsEntry

_RESUME_FORMAT = 2
"""Version of the resume state's binding fields (``format``, ``run_id``, ``config_hash``,
``history``); a state without them was written by an older fathom and cannot be verified."""


def history_record(digest: Any, n_bytes: int, rows: int) -> dict[str, Any]:
    """``{"bytes", "rows", "sha256"}`` of a history prefix (``digest``: a running sha256)."""
    return {"bytes": n_bytes, "rows": rows, "sha256": digest.hexdigest()}


def bind(state: dict[str, Any], run: RecordedRun, history: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the fields that bind it to its run (``run_id``, ``config_hash``), to the
    history it follows and to what it was computed with (:data:`_RECORD_KEY`)."""
    return {
        **state,
        "format": _RESUME_FORMAT,
        "run_id": run.run_id,
        "config_hash": run.config_hash,
        "history": history,
        _RECORD_KEY: manifest_record(run),
    }


def _retrain_advice(run: Path, epochs: int) -> str:
    """What to do when a run cannot continue exactly: what is lost, and how to get it back."""
    if epochs <= 0:
        return f"move {str(run)!r} away and train the run again (no epoch was completed)"
    return (
        f"restore the run directory from a copy, or move {str(run)!r} away and train the run "
        f"again with its config: its {epochs} completed epoch(s) are lost and retrained "
        "(training is deterministic: the final parameters come out the same)"
    )


def check_binding(state: dict[str, Any], run: RecordedRun, path: Path) -> None:
    """Refuse a resume state that is not this run's, or not at an epoch it can be at."""
    where = f"resume state {str(resume_file(path) or path / 'checkpoints')!r}"
    done = run.done
    if state.get("format") != _RESUME_FORMAT:
        raise FathomError(
            f"{where} has no run binding (format {state.get('format')!r}, expected "
            f"{_RESUME_FORMAT}): it was written by an older fathom and cannot be verified "
            f"against this run. Resume it with the fathom version that wrote it, or "
            f"{_retrain_advice(path, done)}"
        )
    for key, ours in (("run_id", run.run_id), ("config_hash", run.config_hash)):
        if state.get(key) != ours:
            raise FathomError(
                f"{where} belongs to another run: its {key} is {state.get(key)!r}, the "
                f"manifest's {ours!r} (checkpoints/ copied from another run "
                f"directory?). Put this run's own checkpoints/ back, or {_retrain_advice(path, done)}"
            )
    epoch = state.get("epoch")
    every = run.config.checkpoints.resume_every
    if type(epoch) is not int or not done - every <= epoch <= done + 1:
        raise FathomError(
            f"{where} is at epoch {epoch!r} but the manifest records {done} completed epochs "
            f"(resume state every {every}): the two come from different moments of the run. "
            f"Restore the run directory from a copy, or {_retrain_advice(path, done)}"
        )


def source_change(
    run: RecordedRun, current: str, allow: bool, epoch: int, path: Path
) -> SourceChange | None:
    """The change of source since the run started (``None``: unchanged, or none recorded).

    A change is refused unless ``allow``; then it is what the run continues with from
    ``epoch`` on (the caller appends it to the manifest's ``source_changes``)."""
    recorded = run.source_hash
    if recorded is None or recorded == current:
        return None
    if not allow:
        raise FathomError(
            f"the fathom source changed since run {str(path)!r} started (recorded source hash "
            f"{recorded[:12]}…, now {current[:12]}…): resuming would mix two code versions in "
            "one run. Restore the original source, start a new run, or pass "
            "--allow-source-change to continue anyway (recorded in the manifest)"
        )
    return SourceChange(from_epoch=epoch, source_hash=current)


def verified_history(data: bytes | None, record: Any, path: Path, epoch: int) -> bytes:
    """The first ``record["bytes"]`` bytes of ``history.jsonl`` (``data``), verified.

    ``data`` is ``None`` when the file is missing. Every row up to the resume point must be
    there as written; otherwise the resume is refused, naming what is wrong.
    """
    if not isinstance(record, dict) or set(record) != {"bytes", "rows", "sha256"}:
        raise FathomError(
            f"resume state of {str(path)!r} has no usable history digest ({record!r}); "
            f"the history it continues from cannot be verified. {_retrain_advice(path, epoch)}"
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
        f"complete. Restore history.jsonl from a copy of the run, or {_retrain_advice(path, epoch)}"
    )


def restart_allowed(run: RecordedRun, path: Path) -> bool:
    """True when a run without a resume state may start again from scratch; else raise.

    No resume state and no completed epoch: the run stopped inside epoch 0 (evaluation,
    epoch-0 checkpoint) and nothing is lost by training it from the start.
    """
    done = run.done
    if done == 0 and not any(int(e) > 0 for e in run.checkpoints):
        return True
    raise FathomError(
        f"the resume state checkpoints/{RESUME_NAME} of {str(path)!r} is missing although the "
        f"manifest records {done} completed epoch(s): it was deleted or lost. The epoch "
        "checkpoints hold weights only, not the optimizer, generator and RNG states an exact "
        f"resume needs: {_retrain_advice(path, done)}"
    )


def check_selected(rd: Any, entry: dict[str, Any] | None, epoch: int) -> int | None:
    """Verify the selected weights a resume state lists; ``None``, or the later epoch the
    file legitimately holds (:func:`newer_selected`), which the replayed epochs rewrite.
    ``rd``: the run's :class:`~fathom.rundir.reader.RunDir` (not imported: the reader
    imports this module)."""
    if not entry:
        return None
    try:
        rd.verify_entry(entry)
        return None
    except FathomError:
        _state, meta = load_weights(rd.path / entry["file"])
    if not newer_selected(meta, rd.recorded, entry.get("epoch", -1)):
        raise FathomError(
            f"checkpoint {entry['file']!r} of run {str(rd.path)!r} holds epoch "
            f"{meta.get('epoch')}, not the selected epoch {entry['epoch']} of the resume state "
            "nor a later one of this run: the run directory was modified; "
            f"{_retrain_advice(rd.path, epoch)}"
        )
    return int(meta["epoch"])


def newer_selected(meta: dict[str, str], run: RecordedRun, epoch: Any) -> bool:
    """Is a self-verifying ``selected.safetensors`` (metadata ``meta``) a legitimate later
    selection than the one of ``epoch`` listed, written by the epoch in flight when the run
    was stopped?

    The selected weights are rewritten whenever validation CE improves, before the epoch's
    manifest commit: after a kill the file may hold a later epoch of the same run.
    """
    try:
        later = int(meta.get("epoch", -1))
    except ValueError:
        return False
    return (
        later > int(-1 if epoch is None else epoch)
        and meta.get("selected") == "1"
        and meta.get("config_hash") == run.config_hash
        and meta.get("run_id") == run.run_id
    )


RESTART_REASON = (
    "no resume state and no completed epoch: the run was stopped inside epoch 0 "
    "(evaluation or epoch-0 checkpoint) and is trained again from the start"
)

UNCHANGED_ON_RESUME = (
    ("data", "files"),
    ("data", "split_hash"),
    ("data", "sizes"),
    ("data", "tensors_sha256"),
    ("environment", "threads"),
)
"""The manifest fields a resumed run must find unchanged: the data it trains on (file
contents, split, and the split tensors' digest) and the thread count (CPU reductions,
hence the parameters, depend on it). ``(section, field)`` of
:class:`~fathom.rundir.record.RecordedRun`."""


def unchanged_inputs(recorded: RecordedRun, current: RecordedRun, path: Path) -> None:
    """Refuse to continue when an input in :data:`UNCHANGED_ON_RESUME` changed.

    A field the recorded manifest lacks (written before it was recorded) is not compared.
    """
    changed = []
    for section, key in UNCHANGED_ON_RESUME:
        given = getattr(recorded, section).given()
        after = getattr(getattr(current, section), key)
        if key in given and given[key] != after:
            changed.append(f"{section}.{key} recorded {_short(given[key])}, now {_short(after)}")
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


# -- agreement with the manifest's own record (see the module docstring) ---------------------
_RECORD_KEY = "manifest_record"
"""The resume state's key holding :func:`manifest_record` of the manifest it was written under."""

BOUND_FIELDS: tuple[tuple[str, str], ...] = (
    ("environment", "threads"),
    ("environment", "device"),
    ("environment", "matmul_precision"),
    ("data", "tensors_sha256"),
    ("data", "split_hash"),
    ("hashes", "initial_params"),
)
"""``(section, field)`` of the manifest (:class:`~fathom.rundir.record.RecordedRun`) that a
resume state must have been computed with: CPU reductions depend on the thread count,
kernels on the device and matmul precision, every step on the data and the initial
parameters."""

_PROGRESS_AT_DONE = (
    ("step", "steps_completed", None),
    ("order_digest", "training_order", "hashes"),
    ("mask_digest", "masks", "hashes"),
)
"""``(state key, manifest field, manifest section)`` equal when the state is at the
manifest's epoch: the state and the commit of one epoch boundary record the same progress."""


def manifest_record(run: RecordedRun) -> dict[str, Any]:
    """``{"section.field": value}`` of :data:`BOUND_FIELDS` the manifest recorded."""
    out = {}
    for section, key in BOUND_FIELDS:
        given = getattr(run, section).given()
        if key in given:
            out[f"{section}.{key}"] = given[key]
    return out


def verify_against_manifest(
    state: dict[str, Any], run: RecordedRun, history: bytes | None, path: Path
) -> None:
    """Refuse a resume state (and the history and checkpoints it continues from) that the
    manifest of ``path`` (``run``) did not record; see the module docstring for what is
    compared."""
    _check_record(state, run, path)
    _check_history(run, history, path)
    _check_checkpoints(state, run, path)
    _check_progress(state, run, path)


def _refuse(path: Path, run: RecordedRun, what: str) -> FathomError:
    return FathomError(
        f"the resume state of run {str(path)!r} is not the one its manifest recorded: {what}. "
        "checkpoints/ or history.jsonl come from another "
        "run (a twin with the same config and run id, trained with another thread count, "
        "device or data?) or from another moment of this one, and continuing would mix two "
        f"runs under one manifest. Put this run's own checkpoints/ and history.jsonl back, or "
        f"{_retrain_advice(path, run.done)}"
    )


def _check_record(state: dict[str, Any], run: RecordedRun, path: Path) -> None:
    recorded = state.get(_RECORD_KEY)
    if recorded is None:  # written before states carried it: the other checks still apply
        return
    ours = manifest_record(run)
    if not isinstance(recorded, dict):
        raise _refuse(path, run, f"the resume state's {_RECORD_KEY} is not a table")
    for name, value in recorded.items():
        if name in ours and ours[name] != value:
            raise _refuse(
                path,
                run,
                f"the resume state was computed with {name} = {value!r}, the manifest "
                f"records {ours[name]!r}",
            )


def _check_history(run: RecordedRun, history: bytes | None, path: Path) -> None:
    if run.integrity is None or history is None:
        return
    sealed = run.integrity.history
    n = sealed.bytes
    if len(history) < n:
        return  # the state's own digest decides (a cut history of an earlier resume)
    if hashlib.sha256(history[:n]).hexdigest() != sealed.sha256:
        raise _refuse(
            path,
            run,
            f"the first {n} bytes of history.jsonl (the {sealed.rows} rows the manifest sealed "
            f"at epoch {run.epochs_completed}) are not the ones it recorded",
        )


def _check_checkpoints(state: dict[str, Any], run: RecordedRun, path: Path) -> None:
    ours = run.checkpoints
    theirs = state.get("checkpoints") or {}
    done, epoch = run.done, int(state["epoch"])
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
                run,
                f"the resume state lists checkpoint {_entry(other)} for epoch {key}, the "
                f"manifest {_entry(mine)}",
            )
    sel, ours_sel = state.get("selected_ckpt"), run.selected_checkpoint
    if sel and ours_sel and sel.get("epoch") == ours_sel.epoch and not _same(ours_sel, sel):
        raise _refuse(
            path,
            run,
            f"the resume state's selected weights of epoch {sel.get('epoch')} are "
            f"{_entry(sel)}, the manifest's {_entry(ours_sel)}",
        )


def _same(ours: WeightsEntry, theirs: dict[str, Any]) -> bool:
    """Does the resume state's entry name the manifest's file with the same digests?"""
    return (
        theirs.get("file") == ours.file
        and theirs.get("params_sha256") == ours.params_sha256
        and theirs.get("sha256") == ours.sha256
    )


def _entry(entry: WeightsEntry | dict[str, Any] | None) -> str:
    if entry is None:
        return "none"
    if isinstance(entry, WeightsEntry):
        return f"{entry.file!r} (sha256 {str(entry.sha256)[:12]}…)"
    return f"{entry.get('file')!r} (sha256 {str(entry.get('sha256'))[:12]}…)"


def _check_progress(state: dict[str, Any], run: RecordedRun, path: Path) -> None:
    if int(state["epoch"]) != run.done:
        return
    for key, field, section in _PROGRESS_AT_DONE:
        ours = getattr(getattr(run, section) if section else run, field)  # absent: None
        if ours is not None and ours != state.get(key):
            name = f"{section}.{field}" if section else field
            raise _refuse(
                path,
                run,
                f"the resume state at epoch {state['epoch']} has {key} {state.get(key)!r}, "
                f"the manifest's {name} at that epoch is {ours!r}",
            )
