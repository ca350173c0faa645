"""Operating-system errors of a run directory as clear :class:`FathomError` s."""

from __future__ import annotations

import errno

from fathom.errors import FathomError

_FIX = {
    errno.ENOSPC: "the disk is full: free space (or choose another --runs-dir) and rerun "
    "(a study retries the run by itself)",
    errno.EDQUOT: "the disk quota is exhausted: free space and rerun",
    errno.EROFS: "the file system is read-only: choose a writable --runs-dir "
    "(or copy the run directory somewhere writable)",
    errno.EACCES: "permission denied: fix the permissions or choose another --runs-dir",
    errno.EPERM: "operation not permitted (an immutable or protected file?): "
    "check `lsattr`/permissions or choose another --runs-dir",
    errno.ENOTDIR: "a file stands where a directory is expected: move it away or choose "
    "another --runs-dir",
    errno.EISDIR: "a directory stands where a file is expected: move it away",
    errno.EEXIST: "a file of that name already exists: move it away",
}


def os_error(e: OSError, doing: str) -> FathomError:
    """``FathomError`` for ``e`` raised while ``doing`` (e.g. "write history.jsonl").

    The message keeps the OS name of the error (``ENOSPC``, ``EROFS``, ...) so that a
    full disk is reported as a full disk, never as a missing or corrupt run directory.
    """
    code = errno.errorcode.get(e.errno or 0, "OSError")
    fix = _FIX.get(e.errno or 0, "check the path and its file system")
    name = getattr(e, "filename", None)
    where = f" ({name})" if name and str(name) not in doing else ""
    err = FathomError(f"cannot {doing}{where}: {code} {e.strerror or e}; {fix}")
    err.errno = e.errno  # type: ignore[attr-defined]
    return err


#: errno values that say the environment failed, not the run: a rerun retries such runs.
ENVIRONMENT_ERRNOS = frozenset(
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
        "environment": isinstance(code, int) and code in ENVIRONMENT_ERRNOS,
    }
