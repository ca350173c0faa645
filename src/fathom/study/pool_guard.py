"""Imported by the local pool's forkserver only (first of ``POOL_PRELOAD`` in
:mod:`fathom.study.pool`): the server dies with the study that started it.

The study sets ``FATHOM_POOL_STUDY`` to its PID only while it starts the server
(:func:`fathom.study.pool.pool_context`). Here, in the server, ``PR_SET_PDEATHSIG``
(Linux) makes the kernel SIGKILL the server when the study exits, and each worker sets the
same signal towards the server (:func:`fathom.study.pool.die_with_study`), so a
``kill -9`` of the study takes every worker down without any of them having to run Python
code (a worker busy in a long torch call cannot run its watch thread). A study already gone
ends the server at once. Anywhere the variable is unset, importing this does nothing.
The signal follows the thread that started the server: ``pool_context`` starts it in the
thread that runs the pool, which outlives that pool; a server that died with an earlier
thread is restarted by the next pool (``multiprocessing.forkserver.ensure_running``).
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def set_parent_death_signal() -> None:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux; nothing elsewhere or on failure."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return  # best effort: each worker's watch of the study's PID still ends it


def _guard_server() -> None:
    """In the forkserver (``FATHOM_POOL_STUDY`` set): die with the study, or now if it is gone."""
    study = os.environ.get("FATHOM_POOL_STUDY")
    if study is None:
        return
    set_parent_death_signal()
    if os.getppid() != int(study):
        os._exit(1)


_guard_server()
