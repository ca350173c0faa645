"""The one exception type for bad input, and the translation of OS errors into it."""

from __future__ import annotations

import errno


class FathomError(Exception):
    """An error caused by the user's input; the message names the problem and the fix.

    The CLI prints it without a traceback and exits with status 2.
    """


DISTRIBUTION = "fathom-depth"
"""The distribution name (``pip``); ``fathom`` on PyPI is an unrelated project."""


def install_hint(extra: str) -> str:
    """How to install an optional extra from a Fathom checkout (there is no PyPI release)."""
    return f"pip install -e '.[{extra}]' in the Fathom checkout (distribution {DISTRIBUTION})"


_FIX = {
    errno.ENOSPC: "the disk is full: free space (or choose another {where}) and rerun",
    errno.EDQUOT: "the disk quota is exhausted: free space (or choose another {where}) and rerun",
    errno.EROFS: "the file system is read-only: choose a writable {where} "
    "(or copy the run directory somewhere writable)",
    errno.EACCES: "permission denied: fix the permissions or choose another {where}",
    errno.EPERM: "operation not permitted (an immutable or protected file?): "
    "check `lsattr`/permissions or choose another {where}",
    errno.ENOTDIR: "a file stands where a directory is expected: move it away or choose "
    "another {where}",
    errno.EISDIR: "a directory stands where a file is expected: move it away",
    errno.EEXIST: "a file of that name already exists: move it away",
}


def os_error(e: OSError, doing: str, where: str = "--runs-dir") -> FathomError:
    """``FathomError`` for ``e`` raised while ``doing`` (e.g. "write history.jsonl").

    The message keeps the OS name of the error (``ENOSPC``, ``EROFS``, ...), says what it
    means and what to do; ``where`` names the option that picks another location
    (``--runs-dir``, ``--out``). A full disk is reported as a full disk, never as a
    missing or corrupt file. The errno is kept as ``.errno``.
    """
    code = errno.errorcode.get(e.errno or 0, "OSError")
    fix = _FIX.get(e.errno or 0, "check the path and its file system").format(where=where)
    name = getattr(e, "filename", None)
    where_it = f" ({name})" if name and str(name) not in doing else ""
    err = FathomError(f"cannot {doing}{where_it}: {code} {e.strerror or e}; {fix}")
    err.errno = e.errno  # type: ignore[attr-defined]
    return err
