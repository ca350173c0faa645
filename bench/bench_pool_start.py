"""Local worker start-up: CPU time a ``--workers N`` pool pays before its first run starts.

Usage: ``python bench/bench_pool_start.py [--workers 2] [--rounds 3]``. Each round starts one
pool of ``--workers`` processes with each start method, alternating (``spawn``, then the local
backend's :func:`fathom.study.pool.pool_context`), and runs one task per worker that imports
what a run needs (``fathom.study.execute``, ``fathom.train.loop``: torch) and returns the worker's own CPU time
(``time.process_time``: since its fork or exec). With the forkserver, the server's one import of
the preload is paid once per study process; it is read from ``/proc/<pid>/stat`` (user + sys)
and stated separately. Medians over the rounds; run it on one torch thread
(``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor


def probe(_: int) -> tuple[int, float]:
    """``(pid, CPU seconds of this worker so far)`` after importing what a run needs."""
    import fathom.study.execute
    import fathom.train.loop  # noqa: F401  (what a run imports: torch, the trainer)

    time.sleep(0.2)  # hold the worker so each task lands on its own process
    return os.getpid(), time.process_time()


def server_cpu() -> float:
    """User + sys CPU seconds of this process's forkserver (``/proc``), 0 without one."""
    import multiprocessing.forkserver as fs

    pid = fs._forkserver._forkserver_pid
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pool_cpu(ctx, workers: int) -> float:
    """Summed worker CPU of one pool of ``workers`` processes, one task each."""
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        seen = dict(pool.map(probe, range(workers)))
    return sum(seen.values())


def main() -> None:
    from fathom.study.pool import pool_context

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()}; {args.workers} workers, {args.rounds} rounds")
    spawn, fork = [], []
    for _ in range(args.rounds):
        spawn.append(pool_cpu(multiprocessing.get_context("spawn"), args.workers))
        fork.append(pool_cpu(pool_context(), args.workers))
    print(f"spawn:      {statistics.median(spawn):6.2f} s CPU per pool (rounds {spawn})")
    print(f"forkserver: {statistics.median(fork):6.2f} s CPU per pool (rounds {fork})")
    print(f"forkserver start (once per study process): {server_cpu():6.2f} s CPU")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
