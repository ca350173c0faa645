"""Operating-system failures of a run: which are the environment's, and how a manifest
records them (the translation into a ``FathomError`` is :func:`fathom.errors.os_error`)."""

from __future__ import annotations

import errno

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
