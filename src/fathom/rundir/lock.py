"""Exclusive locks on run and study directories: one writer at a time, holder named.

A lock is ``fcntl.flock(LOCK_EX | LOCK_NB)`` on a lock file inside the directory, which
holds the holder's PID and start time. The kernel releases a flock when its process dies
(``kill -9`` included), so a lock file left by a dead process is *stale*: the next writer
takes it over and says so (:attr:`DirLock.stale_pid`). A live holder makes a second writer
fail at once with a :class:`~fathom.errors.FathomError` naming the holder's PID.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from types import TracebackType

from fathom.base.interrupts import uninterrupted
from fathom.base.io import RUN_LOCK, STUDY_LOCK
from fathom.errors import FathomError


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(path: Path) -> dict:
    """The holder record of a lock file; ``{}`` when it is empty, unreadable or garbage."""
    try:
        holder = json.loads(path.read_bytes() or b"{}")
    except (OSError, ValueError):  # ValueError: not UTF-8, not JSON
        return {}
    return holder if isinstance(holder, dict) else {}


PROBE_GRACE_S = 0.05
"""How long a writer retries a lock it finds held before it is refused: a reader's probe
(:func:`lock_holder`, a shared lock held for microseconds) never refuses a writer; a
writer's lock, held for the whole run, still refuses the second writer at once."""


def _lock_exclusive(fd: int) -> bool:
    """``flock(LOCK_EX | LOCK_NB)``, retried for :data:`PROBE_GRACE_S`; whether it was taken."""
    deadline = time.monotonic() + PROBE_GRACE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


class DirLock:
    """An exclusive, non-blocking lock on ``directory`` (created if absent).

    ``what`` names the directory in messages (``"run directory"``, ``"study directory"``).
    Use as a context manager, or :meth:`acquire` / :meth:`release`.
    """

    def __init__(
        self, directory: str | os.PathLike, *, name: str = RUN_LOCK, what: str = "run directory"
    ) -> None:
        self.directory = Path(directory)
        self.path = self.directory / name
        self.what = what
        self.fd: int | None = None
        self.stale_pid: int | None = None

    def acquire(self) -> DirLock:
        """Take the lock (or raise naming its holder). Ctrl-C is held back while the lock
        is taken and its holder written, then raised with the lock given back: a lock
        taken by an interrupted call would stay held by this process with nothing to
        release it."""
        try:
            with uninterrupted():
                return self._acquire()
        except KeyboardInterrupt:
            self.release()
            raise

    def _acquire(self) -> DirLock:
        from fathom.errors import os_error

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise os_error(e, f"write to directory {str(self.directory)!r} (to lock it)") from None
        if not _lock_exclusive(fd):
            os.close(fd)
            holder = _holder(self.path)
            pid = holder.get("pid", "unknown")
            err = FathomError(
                f"the {self.what} {str(self.directory)!r} is locked by another fathom process "
                f"(PID {pid}, since {holder.get('since', '?')}); wait for it to finish or stop "
                f"that process (kill {pid}). Two writers would interleave their rows."
            )
            err.holder_pid = pid
            raise err from None
        previous = _holder(self.path).get("pid")
        if isinstance(previous, int) and previous != os.getpid() and not _pid_alive(previous):
            self.stale_pid = previous
        info = {"pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def study_lock(root: str | os.PathLike) -> DirLock:
    """The lock a ``fathom study run`` holds on its study directory for its whole duration."""
    return DirLock(root, name=STUDY_LOCK, what="study directory")


def lock_holder(directory: str | os.PathLike, name: str = RUN_LOCK) -> int | None:
    """The PID of another live process holding ``directory``'s lock, or ``None``.

    Probes with a shared, non-blocking ``flock`` (released at once) on the lock file opened
    read-only: nothing is created or written. The kernel holds a lock exactly as long as its
    process lives, so a writer killed by ``kill -9`` holds none, whatever its lock file still
    says. A lock this process holds itself (an analysis writing into the run) is not another
    holder. A writer taking the lock during the probe waits it out (:data:`PROBE_GRACE_S`).
    A holder whose lock file names no PID is reported as ``-1``.
    """
    try:
        fd = os.open(Path(directory) / name, os.O_RDONLY)
    except OSError:  # no lock file: never locked, or not readable (then not provably held)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(Path(directory) / name).get("pid")
        pid = pid if isinstance(pid, int) else -1
        return None if pid == os.getpid() else pid
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def held_here(directory: str | os.PathLike, name: str = RUN_LOCK) -> bool:
    """Whether this process holds ``directory``'s lock now (which :func:`lock_holder` does not
    count as another holder): its lock file names this PID, and a writer empties the file
    when it releases the lock. A study training its runs in its own process asks this."""
    return _holder(Path(directory) / name).get("pid") == os.getpid()
