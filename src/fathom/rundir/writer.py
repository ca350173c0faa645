"""The one writer of a run directory: start / row / checkpoint / finish, locked and digested.

Lifecycle (one process, one run directory)::

    w = RunWriter(run_dir).acquire()        # exclusive lock (holder PID named to others),
                                            # stray .tmp files of a killed write removed
    w.start(manifest)                       # a new run: empty history, sealed manifest
    state = w.resume(source_hash=..., allow_source_change=...)   # or: continue a run
    w.row(row)                              # one history line (fsync'ed, digested)
    w.save_weights(name, state, meta)       # checkpoints/<name>, digests returned
    w.save_resume(state)                    # checkpoints/resume.pt, self-verifying
    w.commit()                              # manifest.json, sealed with the history digest
    w.finish(status, reason)                # final commit, lock released

Every OS failure (full disk, read-only or immutable file system, a file where a directory
should be) becomes a :class:`FathomError` that names it (``ENOSPC`` ...), see
:func:`fathom.rundir.errors.os_error`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from fathom.errors import FathomError
from fathom.io import atomic_write_bytes, atomic_write_json, dumps, read_jsonl, sha256_bytes
from fathom.rundir import files
from fathom.rundir.errors import failure_record, os_error
from fathom.rundir.interrupts import uninterrupted
from fathom.rundir.lock import DirLock
from fathom.rundir.manifest import note_recovery, seal

#: Fields a resumed run keeps from its manifest on disk (they describe the run's origin).
KEPT_ON_RESUME = ("kind", "phase", "source_hash", "source_changes", "recovery")


class RunWriter:
    """The only code that writes ``manifest.json``, ``history.jsonl`` and ``checkpoints/``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.lock = DirLock(self.path)
        self.manifest: dict[str, Any] | None = None
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._hist = hashlib.sha256()
        self._hist_bytes = 0
        self._hist_rows = 0
        self._disk: dict[str, Any] | None = None

    # -- opening -------------------------------------------------------------------------
    def acquire(self) -> RunWriter:
        """Lock the directory (creating it) and remove stray temp files of killed writes."""
        if self.path.exists() and not self.path.is_dir():
            raise FathomError(
                f"{str(self.path)!r} is a file, not a run directory; move it away or choose "
                "another --runs-dir/--name"
            )
        self.lock.acquire()
        try:
            (self.path / "checkpoints").mkdir(exist_ok=True)
            probe = self.path / ".write-probe.tmp"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            self.lock.release()
            raise os_error(e, f"write to directory {str(self.path)!r}") from None
        if self.lock.stale_pid is not None:
            self._pending.append(("stale_lock_taken_over", {"pid": self.lock.stale_pid}))
        stray = files.stray_tmp_files(self.path)
        for p in stray:
            p.unlink(missing_ok=True)
        if stray:
            names = [str(p.relative_to(self.path)) for p in stray]
            self._pending.append(("removed_temp_files", {"files": names}))
        return self

    def start(self, manifest: dict[str, Any]) -> None:
        """Begin a new run: refuse a directory that already holds one; empty history."""
        self._require_lock()
        if (self.path / "manifest.json").exists():
            raise FathomError(
                f"run directory {str(self.path)!r} already holds a run; use --resume to continue "
                "it or choose another --name/--runs-dir"
            )
        self._guard("write history.jsonl", (self.path / "history.jsonl").write_bytes, b"")
        self._begin(manifest)

    def resume(self, *, source_hash: str, allow_source_change: bool = False) -> dict[str, Any]:
        """Continue the run on disk; return its verified resume state.

        Checks, in order: the manifest digest; the resume state's digest; every epoch
        checkpoint the state lists (and the selected one); the source hash (a change is
        refused unless ``allow_source_change``, then recorded). The history is cut back to
        the resume epoch; dropped rows and torn lines are recorded under ``recovery``.
        """
        from fathom.rundir.reader import RunDir

        self._require_lock()
        rd = RunDir(self.path)
        self._disk = rd.manifest
        if rd.status == "complete":
            raise FathomError(f"run {str(self.path)!r} is already complete; nothing to resume")
        state = files.load_resume(self.path / "checkpoints" / "resume.pt")
        self._check_source(source_hash, allow_source_change, int(state["epoch"]))
        for epoch, entry in sorted(state.get("checkpoints", {}).items(), key=lambda kv: int(kv[0])):
            rd.verify_entry(entry, f"epoch {epoch}")
        if state.get("selected_ckpt"):
            self._check_selected(rd, state["selected_ckpt"], int(state["epoch"]))
        self._truncate_history(int(state["epoch"]))
        return state

    def _check_selected(self, rd: Any, entry: dict[str, Any], epoch: int) -> None:
        """The selected weights match the resume state, or were written after it.

        ``selected.safetensors`` is rewritten whenever validation CE improves, so after a
        kill it may hold a later epoch than the resume state: that file must still pass
        its own digest and say so; the replayed epochs rewrite it identically.
        """
        try:
            rd.verify_entry(entry, "selected")
            return
        except FathomError:
            _state, meta = files.load_weights(self.path / entry["file"])
        later = int(meta.get("epoch", -1))
        if later <= epoch:
            raise FathomError(
                f"checkpoint {entry['file']!r} of run {str(self.path)!r} holds epoch {later}, "
                f"not the selected epoch {entry['epoch']} of the resume state: the run directory "
                "was modified; restore it or train again"
            )
        self._pending.append(("selected_beyond_resume_point", {"epoch": later, "resume": epoch}))

    def _check_source(self, current: str, allow: bool, epoch: int) -> None:
        recorded = (self._disk or {}).get("source_hash")
        if recorded is None or recorded == current:
            return
        if not allow:
            raise FathomError(
                f"the fathom source changed since run {str(self.path)!r} started (recorded "
                f"source hash {recorded[:12]}…, now {current[:12]}…): resuming would mix two "
                "code versions in one run. Restore the original source, start a new run, or "
                "pass --allow-source-change to continue anyway (recorded in the manifest)"
            )
        changes = list((self._disk or {}).get("source_changes") or [])
        changes.append({"from_epoch": epoch, "source_hash": current})
        assert self._disk is not None
        self._disk["source_changes"] = changes
        self._pending.append(("source_changed", {"from_epoch": epoch, "source_hash": current}))

    def _truncate_history(self, epoch: int) -> None:
        path = self.path / "history.jsonl"
        rows, bad = read_jsonl(path)
        kept = [r for r in rows if isinstance(r.get("epoch"), int) and r["epoch"] <= epoch]
        if bad:
            self._pending.append(
                ("history_lines_unreadable", {"lines": bad, "resumed_from": epoch})
            )
        if len(kept) < len(rows):
            dropped = [r.get("epoch") for r in rows if r not in kept]
            self._pending.append(
                ("history_truncated", {"to_epoch": epoch, "dropped_epochs": dropped})
            )
        data = "".join(dumps(r) + "\n" for r in kept).encode()
        self._guard("rewrite history.jsonl", atomic_write_bytes, path, data)
        self._hist = hashlib.sha256(data)
        self._hist_bytes, self._hist_rows = len(data), len(kept)

    def _begin(self, manifest: dict[str, Any]) -> None:
        if self._disk is not None:
            for key in KEPT_ON_RESUME:
                if key in self._disk:
                    manifest[key] = self._disk[key]
        manifest.setdefault("kind", "run")
        manifest.setdefault("phase", None)
        for event, details in self._pending:
            note_recovery(manifest, event, **details)
        self._pending.clear()
        self.manifest = manifest
        self.commit()

    def begin_resumed(self, manifest: dict[str, Any]) -> None:
        """Adopt ``manifest`` (rebuilt by the trainer) for a resumed run and commit it."""
        if self._disk is None:
            raise FathomError("begin_resumed() needs resume() first")
        self._begin(manifest)

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
        """``checkpoints/resume.pt`` (self-verifying); returns its payload digest."""
        self._require_lock()
        path = self.path / "checkpoints" / "resume.pt"
        return self._guard("write the resume state", files.save_resume, path, state)

    def commit(self) -> None:
        """Write the manifest atomically, sealed with the history digest."""
        self._require_lock()
        assert self.manifest is not None
        self.manifest.setdefault("integrity", {})["history"] = {
            "bytes": self._hist_bytes,
            "rows": self._hist_rows,
            "sha256": self._hist.hexdigest(),
        }
        seal(self.manifest)
        self._guard(
            "write manifest.json", atomic_write_json, self.path / "manifest.json", self.manifest
        )

    def finish(self, status: str, reason: str | None = None, **fields: Any) -> None:
        """Set the final status (and ``fields``), commit, release the lock."""
        assert self.manifest is not None
        self.manifest.update(status=status, status_reason=reason, **fields)
        try:
            self.commit()
        finally:
            self.close()

    def record_failure(self, e: Exception) -> FathomError | None:
        """Best effort: finish the run as ``failed`` with ``e`` as its cause (and errno,
        :func:`~fathom.rundir.errors.failure_record`); unlock.

        When ``e`` is a ``FathomError`` that cannot be recorded (the disk is full, the file
        system went read-only), returns the error to raise instead: ``e``, saying so and
        that the manifest keeps its last commit.
        """
        reason = str(e) if isinstance(e, FathomError) else f"{type(e).__name__}: {e}"
        try:
            if self.manifest is not None and self.lock.held:
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
            err.errno = getattr(e, "errno", None)  # type: ignore[attr-defined]
            return err
        finally:
            self.close()

    def interrupted(self) -> None:
        """Best effort on Ctrl-C: commit the manifest (status stays ``running``), unlock."""
        try:
            if self.manifest is not None and self.lock.held:
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
