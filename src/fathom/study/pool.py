"""The local backend's worker processes: forked from a forkserver this process starts, each
dying with this process and taking its environment and a device (:func:`local_pool`).

A worker inherits nothing of the study's memory: :func:`pool_context` says why the forkserver
is safe to fork from and what a worker starts with; :mod:`fathom.study.pool_guard` (imported
by the server) and :func:`die_with_study` end the server and every worker with the study.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from fathom.errors import FathomError

POOL_PRELOAD = ("fathom.study.pool_guard", "torch", "fathom.study.execute", "fathom.train.loop")
"""Modules the local pool's forkserver imports once, before it forks any worker (what a run
imports; a name that fails to import is skipped by multiprocessing, and the worker imports
it itself)."""

_POOL_OWNER: list[int] = []  # the PID that started this interpreter's forkserver


def pool_context() -> multiprocessing.context.BaseContext:
    """The local pool's start method: ``forkserver`` with :data:`POOL_PRELOAD` imported.

    A ``spawn`` worker is a fresh interpreter that imports torch (seconds of CPU each). The
    forkserver is one such interpreter, started at the first pool: it imports the preload and
    then only forks; every worker is a fork of it and starts with torch imported. Forking is
    safe there because the forkserver is single-threaded and never runs torch compute, so no
    intra-op/OpenMP thread pool, CUDA context or lock held by another thread exists in it
    (what makes forking a process that has trained unsafe). A worker gets nothing from the
    study's memory: its task and arguments are pickled and multiprocessing prepares it from
    the study's working directory, ``sys.path`` and ``__main__`` as it prepares a spawned
    one; :func:`_init_worker` adds the study's environment of the moment (a spawned worker
    inherits it; a forked one would have the forkserver's). A run so computes what it would in
    a spawned worker (same final-parameter hash: ``tests/test_study_backends.py``,
    ``tests/test_study_integrity.py``).

    A process forked from one that started the forkserver inherits the parent's handle to a
    server that is not its child; that handle is dropped here so this process starts its own
    (its workers must die with it, not with the process it was forked from). It also inherits
    the parent's locks as they were at the fork: one that another thread of the parent held
    then (the resource tracker's, taken by any thread that creates or frees a
    multiprocessing lock) is held forever here, by a thread that does not exist in this
    process, and the pool would wait on it for good (CPython gh-96971). Only this thread runs
    here, so both locks are replaced by free ones.
    """
    import multiprocessing.forkserver as fs
    import os
    import threading
    from multiprocessing import resource_tracker

    if _POOL_OWNER and _POOL_OWNER[0] != os.getpid():
        server = fs._forkserver
        if server._forkserver_alive_fd is not None:
            os.close(server._forkserver_alive_fd)
        server._forkserver_address = server._forkserver_alive_fd = None
        server._forkserver_pid = None
        server._lock = threading.Lock()
        tracker = resource_tracker._resource_tracker
        reentrant = isinstance(tracker._lock, type(threading.RLock()))  # an RLock since gh-109629
        tracker._lock = threading.RLock() if reentrant else threading.Lock()
        _POOL_OWNER.clear()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(POOL_PRELOAD))
    os.environ["FATHOM_POOL_STUDY"] = str(os.getpid())  # read by fathom.study.pool_guard
    try:
        fs.ensure_running()
    finally:
        del os.environ["FATHOM_POOL_STUDY"]
    if not _POOL_OWNER:
        _POOL_OWNER.append(os.getpid())
    return ctx


@contextmanager
def local_pool(devices: Sequence[int | None]) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``len(devices)`` local workers (:func:`pool_context`): each dies with this
    process and takes this process's environment and one of ``devices`` (a CUDA index, or
    ``None`` to leave the device alone) as it starts (:func:`_init_worker`).

    On exit the pool is shut down and the queue that hands out the devices is closed and its
    feeder thread joined. Left to itself, that thread frees the queue's semaphores some time
    after the pool is gone, taking the resource tracker's lock to do so; a fork at that moment
    (a test, a user's own ``os.fork``) would leave the child that lock held for good. So no
    thread of the pool outlives it.
    """
    import os

    ctx = pool_context()
    indices = ctx.Queue()
    for index in devices:
        indices.put(index)
    try:
        with ProcessPoolExecutor(
            max_workers=len(devices),
            mp_context=ctx,
            initializer=_init_worker,
            initargs=(os.getpid(), indices, dict(os.environ)),
        ) as pool:
            yield pool
    finally:
        indices.close()
        indices.join_thread()


def die_with_study(study_pid: int, poll_s: float = 0.5) -> None:
    """Worker initializer: end this worker as soon as the study process ``study_pid`` dies.

    A worker blocked on its task pipe never notices a ``kill -9`` of the study by itself. Its
    parent is the forkserver, which the kernel kills with the study
    (:mod:`fathom.study.pool_guard`); the worker sets ``PR_SET_PDEATHSIG`` towards it, so
    the kernel ends it too, even inside a long torch call. Besides (other systems, a race
    at start), a daemon thread waits on a pidfd of the study (Linux >= 5.3: readable the
    moment it exits) or polls ``os.kill(study_pid, 0)`` every ``poll_s`` seconds, and ends
    the process with ``os._exit``; a study already gone ends it at once.
    """
    import os
    import select
    import threading
    import time

    from fathom.study.pool_guard import set_parent_death_signal

    set_parent_death_signal()
    try:
        fd = os.pidfd_open(study_pid) if hasattr(os, "pidfd_open") else None
    except ProcessLookupError:
        os._exit(1)
    except OSError:
        fd = None

    def alive() -> bool:
        try:
            os.kill(study_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, another user's
            pass
        return True

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])
        else:
            while alive():
                time.sleep(poll_s)
        os._exit(1)

    if not alive():
        os._exit(1)
    threading.Thread(target=watch, name="fathom-study-watch", daemon=True).start()


def _init_worker(study_pid: int, indices: Any, environ: dict[str, str]) -> None:
    """Worker initializer: die with the study (:func:`die_with_study`), take the study's
    environment (a forkserver started earlier may have another one), then take a device."""
    import os

    die_with_study(study_pid)
    os.environ.clear()
    os.environ.update(environ)
    init_worker_device(indices)


def worker_devices(workers: int) -> list[int]:
    """CUDA device index of each local worker process: worker ``i`` -> ``i mod device_count``.

    With as many GPUs as workers every worker has its own device; with fewer, workers share
    them round-robin (never all on ``cuda:0``).
    """
    import torch

    count = torch.cuda.device_count()
    if count < 1:
        raise FathomError("no CUDA device is visible; worker devices apply to GPU runs only")
    return [i % count for i in range(workers)]


def init_worker_device(indices: Any) -> None:
    """Pool initializer: take this worker's device index from the queue and make it current,
    so the runs' ``cuda`` device (and CUDA graphs) land on it; ``None`` leaves the device alone."""
    index = indices.get()
    if index is not None:
        import torch

        torch.cuda.set_device(index)
