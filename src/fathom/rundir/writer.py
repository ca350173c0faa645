"""The one writer of a run directory: start / row / checkpoint / finish, locked and digested.

Lifecycle (one process, one run directory)::

    w = RunWriter(run_dir).acquire()        # exclusive lock (holder PID named to others),
                                            # stray .tmp files of a killed write removed
    state = w.resume(source_hash=..., allow_source_change=...)   # to continue a run
    w.prepare(manifest)                     # the typed RunManifest (nothing written yet)
    w.start()  /  w.begin_resumed()         # a new run (empty history) / the resumed one
    w.row(row)                              # one history line (fsync'ed, digested)
    w.save_weights(name, state, meta)       # checkpoints/<name>, digests returned
    w.save_resume(state)                    # checkpoints/resume.safetensors, self-verifying
    w.progress(...); w.set_stop(...)        # the manifest's sections, typed
    w.commit()                              # manifest.json, sealed with the history digest
    w.set_final(...); w.finish(status, reason)   # final commit, lock released
    w.interrupted(reason) / w.record_failure(e)  # best effort on Ctrl-C / a failure

The trainer never indexes or mutates the manifest itself (``tests/test_rundir_record.py``
checks ``fathom.train`` for it): it prepares a :class:`~fathom.rundir.record.RunManifest`
and changes it only through these methods, each validated by its section's type
(:mod:`fathom.rundir.sections`).
Every OS failure (full disk, read-only file system, a file where a directory should be)
becomes a :class:`FathomError` naming it (``ENOSPC`` ...): :func:`~fathom.errors.os_error`.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from fathom.base.interrupts import uninterrupted
from fathom.base.io import atomic_write_bytes, atomic_write_json, dumps, parse_jsonl, sha256_bytes
from fathom.errors import FathomError, os_error
from fathom.rundir import files
from fathom.rundir.lock import DirLock
from fathom.rundir.manifest import check_manifest, read_recorded, seal
from fathom.rundir.record import RecordedRun, RunManifest
from fathom.rundir.resume import (
    RESTART_REASON,
    bind,
    check_binding,
    check_selected,
    history_record,
    restart_allowed,
    source_change,
    unchanged_inputs,
    verified_history,
    verify_against_manifest,
)
from fathom.rundir.sections import (
    Clocks,
    Failure,
    Final,
    RecoveryEvent,
    Selected,
    Status,
    Stop,
    Telemetry,
    WeightsEntry,
)

#: Fields a resumed run keeps from its manifest on disk (they describe the run's origin).
_KEPT_ON_RESUME = ("kind", "phase", "source_hash", "source_changes", "recovery")


class RunWriter:
    """The only code that writes ``manifest.json``, ``history.jsonl`` and ``checkpoints/``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.lock = DirLock(self.path)
        self.manifest: RunManifest | None = None
        self._begun = False  # the manifest was committed once (start / begin_resumed)
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._hist = hashlib.sha256()
        self._hist_bytes = 0
        self._hist_rows = 0
        self._disk: dict[str, Any] | None = None  # the manifest on disk, as written
        self._recorded: RecordedRun | None = None  # its fields a resume compares, typed
        self._restart = False
        self._cut: bytes | None = None  # the verified history a resume cuts back to

    # -- opening -------------------------------------------------------------------------
    def acquire(self) -> RunWriter:
        """Lock the directory (creating it) and remove stray temp files of killed writes.

        Ctrl-C is held back until that is done, then raised with the lock given back."""
        files.check_run_dir(self.path)
        self.lock.acquire()
        try:
            with uninterrupted():
                self._make_writable()
        except OSError as e:
            self.lock.release()
            raise os_error(e, f"write to directory {str(self.path)!r}") from None
        except KeyboardInterrupt:
            self.lock.release()
            raise
        return self

    def _make_writable(self) -> None:
        """``checkpoints/`` created, a write probed, stray temp files removed (recorded)."""
        (self.path / "checkpoints").mkdir(exist_ok=True)
        probe = self.path / ".write-probe.tmp"
        probe.write_bytes(b"")
        probe.unlink()
        if self.lock.stale_pid is not None:
            self._pending.append(("stale_lock_taken_over", {"pid": self.lock.stale_pid}))
        stray = files.stray_tmp_files(self.path)
        for p in stray:
            p.unlink(missing_ok=True)
        if stray:
            names = [str(p.relative_to(self.path)) for p in stray]
            self._pending.append(("removed_temp_files", {"files": names}))

    def start(self, manifest: RunManifest | None = None) -> None:
        """Begin a new run: refuse a directory that already holds one; empty history.

        After :meth:`resume` found a run stopped before its first epoch boundary
        (:func:`~fathom.rundir.resume.restart_allowed`), the run starts over it (recorded).
        """
        self._require_lock()
        if (self.path / "manifest.json").exists() and not self._restart:
            raise FathomError(
                f"run directory {str(self.path)!r} already holds a run; use --resume to continue "
                "it or choose another --name/--runs-dir"
            )
        with uninterrupted():  # the first record: the empty history and the manifest, or neither
            self._guard("write history.jsonl", atomic_write_bytes, self.path / "history.jsonl", b"")
            self._hist, self._hist_bytes, self._hist_rows = hashlib.sha256(), 0, 0
            self._disk = self._recorded = None  # a restart keeps nothing but its record
            self._begin(manifest)

    def resume(
        self, *, source_hash: str, allow_source_change: bool = False
    ) -> dict[str, Any] | None:
        """Continue the run on disk; return its verified resume state (``None``: restart).

        Checks, in order: the manifest digest; the resume state's digest and its binding to
        this run (:func:`~fathom.rundir.resume.check_binding`); the source hash (a change is
        refused unless ``allow_source_change``, then recorded); every epoch checkpoint the
        state lists (and the selected one); the history rows up to the resume point against
        the digest the state recorded; the state, history and checkpoints against the
        manifest's own record (:func:`~fathom.rundir.resume.verify_against_manifest`:
        a twin's files are refused). Rows after it are cut; they and torn lines among them
        are recorded under ``recovery``. A run with no resume state and no completed epoch
        returns ``None``: the caller starts it again (:meth:`start`, recorded).
        """
        from fathom.rundir.reader import RunDir

        self._require_lock()
        rd = RunDir(self.path)
        self._disk, recorded = rd.manifest, rd.recorded
        self._recorded = recorded
        if rd.status == "complete":
            raise FathomError(f"run {str(self.path)!r} is already complete; nothing to resume")
        if recorded.integrity is None:
            raise FathomError(
                f"manifest.json of {str(self.path)!r} has no digests (not written by fathom): "
                "what a resume continues from cannot be verified; train the run again"
            )
        path = files.resume_file(self.path)
        if path is None and restart_allowed(recorded, self.path):
            self._restart = True
            self._pending.append(("restarted", {"reason": RESTART_REASON, "found": rd.status}))
            return None
        assert path is not None
        state = files.load_resume(path)
        check_binding(state, recorded, self.path)
        epoch = int(state["epoch"])
        change = source_change(recorded, source_hash, allow_source_change, epoch, self.path)
        if change is not None:  # kept on resume (_KEPT_ON_RESUME), recorded
            changes = [*recorded.source_changes, change]
            self._disk["source_changes"] = [c.model_dump(mode="json") for c in changes]
            self._pending.append(("source_changed", change.model_dump(mode="json")))
        for _, entry in sorted(state.get("checkpoints", {}).items(), key=lambda kv: int(kv[0])):
            rd.verify_entry(entry)
        later = check_selected(rd, state.get("selected_ckpt"), epoch)
        if later is not None:
            self._pending.append(
                ("selected_beyond_resume_point", {"epoch": later, "resume": epoch})
            )
        self._verify_history(state["history"], epoch)
        history = self._guard("read history.jsonl", _read_or_none, self.path / "history.jsonl")
        verify_against_manifest(state, recorded, history, self.path)
        return state

    def _verify_history(self, record: Any, epoch: int) -> None:
        """Verify the rows up to the resume point; the rows after it are cut (and recorded)
        by :meth:`begin_resumed`, once every check has passed: a refusal changes nothing."""
        path = self.path / "history.jsonl"
        data = self._guard("read history.jsonl", _read_or_none, path)
        kept = verified_history(data, record, self.path, epoch)
        assert data is not None
        rest = data[len(kept) :]
        if rest:
            rows, bad = parse_jsonl(rest)
            if bad:
                lines = [record["rows"] + n for n in bad]
                self._pending.append(
                    ("history_lines_unreadable", {"lines": lines, "resumed_from": epoch})
                )
            if rows:
                dropped = [r.get("epoch") if isinstance(r, dict) else None for r in rows]
                self._pending.append(
                    ("history_truncated", {"to_epoch": epoch, "dropped_epochs": dropped})
                )
            self._cut = kept
        self._hist = hashlib.sha256(kept)
        self._hist_bytes, self._hist_rows = len(kept), int(record["rows"])

    def _begin(self, manifest: RunManifest | None) -> None:
        if manifest is not None:
            self.prepare(manifest)
        if self._disk is not None:
            kept = {  # its origin, and sections this version does not declare
                k: v
                for k, v in self._disk.items()
                if k in _KEPT_ON_RESUME or k not in RunManifest.model_fields
            }
            self.manifest = RunManifest.model_validate({**self._json(), **kept})
        events = [RecoveryEvent(event=e, **details) for e, details in self._pending]
        self._held().recovery = [*self._held().recovery, *events]
        self._pending.clear()
        self.commit()
        self._begun = True

    def begin_resumed(self, manifest: RunManifest | None = None) -> None:
        """Adopt the prepared manifest (rebuilt by the trainer) for a resumed run; commit it.

        Refused when what the run continues with differs from what it was started with
        (:func:`~fathom.rundir.resume.unchanged_inputs`: dataset content, thread count).
        """
        if self._recorded is None:
            raise FathomError("begin_resumed() needs resume() first")
        if manifest is not None:
            self.prepare(manifest)
        unchanged_inputs(self._recorded, self._current(), self.path)
        if self._cut is not None:
            path = self.path / "history.jsonl"
            self._guard("rewrite history.jsonl", atomic_write_bytes, path, self._cut)
            self._cut = None
        converted = self._guard("convert resume.pt", files.convert_legacy, self.path)
        if converted:  # the state was read from an older fathom's resume.pt
            self._pending.append(("resume_state_converted", converted))
        self._begin(None)

    @property
    def recorded(self) -> RecordedRun | None:
        """What the manifest found on disk by :meth:`resume` recorded (``RunDir.recorded``,
        any format; ``None`` for a new run)."""
        return self._recorded

    def note(self, event: str, **details: Any) -> None:
        """Record ``event`` under ``recovery`` at the next :meth:`start` / :meth:`begin_resumed`."""
        self._pending.append((event, details))

    # -- writing -------------------------------------------------------------------------
    def row(self, row: dict[str, Any]) -> None:
        """Append one history line (fsync'ed); the digest is sealed at the next commit."""
        self._require_lock()
        line = (dumps(row) + "\n").encode()

        def append() -> None:
            with open(self.path / "history.jsonl", "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())

        with uninterrupted():  # the line and the digest that covers it
            self._guard("append to history.jsonl", append)
            self._hist.update(line)
            self._hist_bytes += len(line)
            self._hist_rows += 1

    def save_weights(
        self, name: str, state: dict[str, torch.Tensor], metadata: dict[str, Any]
    ) -> dict[str, Any]:
        """``checkpoints/<name>``; returns the manifest entry ``{file, params_sha256, sha256}``."""
        self._require_lock()
        path = self.path / "checkpoints" / name
        data, digest = files.encode_weights(state, metadata)
        self._guard(f"write checkpoint {name}", atomic_write_bytes, path, data)
        return {
            "file": f"checkpoints/{name}",
            "params_sha256": digest,
            "sha256": sha256_bytes(data),
        }

    def save_resume(self, state: dict[str, Any]) -> str:
        """``checkpoints/resume.safetensors`` (self-verifying), bound to this run and to the
        history written so far (:func:`~fathom.rundir.resume.bind`); returns its digest."""
        self._require_lock()
        path = self.path / "checkpoints" / files.RESUME_NAME
        bound = bind(state, self._current(), self._history_record())
        return self._guard("write the resume state", files.save_resume, path, bound)

    def _history_record(self) -> dict[str, Any]:
        return history_record(self._hist, self._hist_bytes, self._hist_rows)

    # -- the manifest's sections (committed by commit) --------------------------------------
    def prepare(self, manifest: RunManifest) -> None:
        """Hold ``manifest`` for this run: the sections change through the methods below and
        are written by :meth:`start` / :meth:`begin_resumed`, never before."""
        if not isinstance(manifest, RunManifest):
            raise FathomError(
                f"RunWriter.prepare() takes a RunManifest, got a {type(manifest).__name__}; "
                "build it with fathom.rundir.RunManifest(...)"
            )
        self.manifest = manifest

    def progress(
        self,
        *,
        epochs_completed: int,
        steps_completed: int,
        clocks: dict[str, float | None],
        telemetry: Telemetry,
        training_order: str,
        masks: str,
        selected: dict[str, Any],
        checkpoints: dict[str, dict[str, Any]],
        selected_checkpoint: dict[str, Any] | None,
        graphs_captured: int | None,
    ) -> None:
        """Record the run's progress at an epoch boundary (committed by :meth:`commit`):
        completed epochs and steps, clocks, telemetry overhead and layers, the training-order
        and mask digest chains, the selected epoch, the weights entries, graphs captured."""
        m = self._held()
        m.epochs_completed, m.steps_completed = epochs_completed, steps_completed
        m.clocks = Clocks.model_validate(clocks)
        m.telemetry = telemetry
        m.hashes = _updated(m.hashes, training_order=training_order, masks=masks)
        m.selected = Selected.model_validate(selected)
        m.checkpoints = {e: WeightsEntry.model_validate(c) for e, c in checkpoints.items()}
        m.selected_checkpoint = (
            None
            if selected_checkpoint is None
            else WeightsEntry.model_validate(selected_checkpoint)
        )
        m.execution = _updated(m.execution, graphs_captured=graphs_captured)

    def set_stop(
        self, *, target_test_acc: float, epoch: int, training_s: float, elapsed_s: float
    ) -> None:
        """A reached target stops the run at ``epoch`` (the ``stop`` section)."""
        self._held().stop = Stop(
            target_test_acc=target_test_acc,
            epoch=epoch,
            training_s=training_s,
            elapsed_s=elapsed_s,
        )

    def set_final(
        self, *, final_params: str | None, epoch: int | None, diverged_epoch: int | None
    ) -> None:
        """The outcome's digests: ``hashes.final_params`` and ``final.epoch`` (``None`` unless
        the run completed) and ``diverged_epoch`` (``None`` unless it diverged)."""
        m = self._held()
        m.hashes = _updated(m.hashes, final_params=final_params)
        m.final = Final(epoch=epoch)
        m.diverged_epoch = diverged_epoch

    def finish(
        self, status: Status, reason: str | None = None, *, failure: dict[str, Any] | None = None
    ) -> None:
        """Set the final status, its reason (and a failure's cause, :func:`failure_record`),
        commit, release the lock.

        Ctrl-C is held back until the lock is released: cut inside the commit, the lock
        released in ``finally`` would leave the previous commit (``running``) with nothing
        left to record ``interrupted``; held back, the run is recorded finished and the
        interrupt is raised after."""
        m = self._held()
        with uninterrupted():
            m.status, m.status_reason = status, reason
            if failure is not None:
                m.failure = Failure.model_validate(failure)
            try:
                self.commit()
            finally:
                self.close()

    def _held(self) -> RunManifest:
        if self.manifest is None:
            raise FathomError("the writer holds no manifest: call prepare(manifest) first")
        return self.manifest

    def _json(self) -> dict[str, Any]:
        return self._held().to_json()

    def _current(self) -> RecordedRun:
        """The held manifest read as a resume reads it (compared with the recorded one)."""
        return read_recorded(self._json(), "the manifest being written")

    def commit(self) -> None:
        """Write the manifest atomically, sealed with the history digest; it is validated
        by the one validator first (never write what no reader reads)."""
        self._require_lock()
        data = self._json()
        data["integrity"] = {"history": self._history_record()}
        check_manifest(seal(data), "the manifest being written")
        self._guard("write manifest.json", atomic_write_json, self.path / "manifest.json", data)

    def record_failure(self, e: BaseException) -> FathomError | None:
        """Best effort: finish the run as ``failed`` with ``e`` as its cause (and errno,
        :func:`failure_record`); unlock.

        When ``e`` is a ``FathomError`` that cannot be recorded (the disk is full, the file
        system went read-only), returns the error to raise instead: ``e``, saying so and
        that the manifest keeps its last commit.
        """
        reason = str(e) if isinstance(e, FathomError) else f"{type(e).__name__}: {e}"
        try:
            if self._begun and self.lock.held:
                self.finish("failed", reason, failure=failure_record(e))
            return None
        except FathomError as unrecorded:
            if not isinstance(e, FathomError):
                return None
            err = FathomError(
                f"{e}. The failure could not be recorded either "
                f"({str(unrecorded).split(';')[0]}): manifest.json keeps its last commit, "
                "which still verifies; once the cause is fixed, continue with "
                f"`fathom train --resume {self.path}`"
            )
            err.errno = getattr(e, "errno", None)
            err.__dict__.update(vars(e))  # what callers attached (errno, advice given)
            return err
        finally:
            self.close()

    def interrupted(self, reason: str | None = None) -> None:
        """Best effort on Ctrl-C or SIGTERM: commit the manifest with status ``interrupted``
        (it can be resumed) and ``reason`` as its ``status_reason``, unlock. Before
        :meth:`start` / :meth:`begin_resumed` nothing is written (the directory stays as it
        was). A second Ctrl-C is held back until the record is written and the lock
        released."""
        with uninterrupted():
            try:
                if self._begun and self.lock.held:
                    m = self._held()
                    m.status, m.status_reason = "interrupted", reason
                    self.commit()
            except FathomError:
                pass
            finally:
                self.close()

    def close(self) -> None:
        self.lock.release()

    # -- helpers -------------------------------------------------------------------------
    def _require_lock(self) -> None:
        if not self.lock.held:
            raise FathomError(f"the writer of {str(self.path)!r} holds no lock (closed?)")

    @staticmethod
    def _guard(doing: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except OSError as e:
            raise os_error(e, doing) from None


def _read_or_none(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def _updated(section: Any, **changes: Any) -> Any:
    """``section`` with ``changes``, validated by its type."""
    return type(section).model_validate({**section.model_dump(by_alias=True), **changes})


#: errno values that say the environment failed, not the run: a rerun retries such runs.
_ENVIRONMENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
)


def failure_record(e: BaseException) -> dict[str, object]:
    """``{"type", "errno", "environment"}`` of a run's failure, for its manifest.

    ``environment`` is true for an OS failure of the machine (full disk, read-only file
    system, I/O error): such a run did not fail by itself, and a study reruns it.
    """
    code = getattr(e, "errno", None)
    if code is None and isinstance(e.__cause__, OSError):
        code = e.__cause__.errno
    return {
        "type": type(e).__name__,
        "errno": errno.errorcode.get(code) if isinstance(code, int) else None,
        "environment": isinstance(code, int) and code in _ENVIRONMENT_ERRNOS,
    }
