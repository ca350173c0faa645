"""A real CLI process without a fresh interpreter: fork this pytest process, run
``fathom.cli.main(argv)`` (or any callable) in the child.

A test that kills a ``fathom`` command (SIGKILL, SIGINT), holds a lock from another process,
or needs a process boundary pays ~4 s of CPU for the torch import when it starts
``python -m fathom.cli``. The pytest worker has imported torch and Fathom already, so
:func:`fork_cli` forks it: the child is a real process (its own pid, its own locks, killed
by a real signal, its CPU time reaped into ``RUSAGE_CHILDREN``), with stdout and stderr in
files, stdin on ``/dev/null``, SIGINT back to Python's ``KeyboardInterrupt`` and SIGTERM to
the default, one torch thread (the suite's), and ``os._exit`` at the end (no pytest or
xdist teardown runs in the child). What a fresh interpreter adds over this -- the
``python -m fathom.cli`` entry point and import-time behaviour -- is tested by the
subprocess tests of ``tests/test_cli.py`` and ``tests/test_lazy.py``.

Use the ``forked`` fixture (``conftest.py``): a child still running at teardown is killed
and reaped, so a failing test leaves no process behind.
"""

from __future__ import annotations

import faulthandler
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path


class Forked:
    """A forked child running ``target()``; the subset of :class:`subprocess.Popen` the tests
    use (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``communicate``,
    ``returncode``: negative for a signal, as ``Popen`` reports it)."""

    def __init__(
        self,
        target: Callable[[], int | None],
        env: Mapping[str, str | None] | None = None,
        new_session: bool = False,
        out_dir: Path | None = None,
    ) -> None:
        self.out = Path(tempfile.mkstemp(prefix="forked-", suffix=".out", dir=out_dir)[1])
        self.err = Path(tempfile.mkstemp(prefix="forked-", suffix=".err", dir=out_dir)[1])
        self.returncode: int | None = None
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(target, dict(env or {}), self.out, self.err, new_session)
        self.pid = pid

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise ForkedTimeout(f"forked pid {self.pid}", timeout, self._where())
            time.sleep(0.005)
        return self.returncode

    def _where(self) -> str:
        """Where a child that outlived its wait is: every thread's Python stack (SIGUSR1 makes
        the child's faulthandler write them to its stderr), then each descendant process's
        state, kernel wait channel and command line."""
        os.kill(self.pid, signal.SIGUSR1)
        time.sleep(0.5)
        return f"{self.output()[-8000:]}\ndescendants:\n{_descendants(self.pid)}"

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> str:
        """stdout then stderr, as written so far."""
        return self.out.read_text() + self.err.read_text()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.out.read_text(), self.err.read_text()

    def cleanup(self) -> None:
        """Kill and reap the child if it still runs; remove its output files."""
        if self.poll() is None:
            self.kill()
            self.wait()
        for p in (self.out, self.err):
            p.unlink(missing_ok=True)


class ForkedTimeout(subprocess.TimeoutExpired):
    """:class:`subprocess.TimeoutExpired` that shows where the child was stuck."""

    def __init__(self, cmd: str, timeout: float, where: str) -> None:
        super().__init__(cmd, timeout, output=where)

    def __str__(self) -> str:
        return f"{super().__str__()}; where it was:\n{self.output}"


def _descendants(pid: int) -> str:
    """``PID STATE WCHAN CMDLINE`` of every process below ``pid`` (Linux ``/proc``)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        parent[int(stat.parent.name)] = (int(fields[1]), fields[0])
    rows, todo = [], [pid]
    while todo:
        above = todo.pop()
        below = sorted(p for p, (pp, _) in parent.items() if pp == above)
        todo += below
        for p in below:
            try:
                wchan = Path(f"/proc/{p}/wchan").read_text()
                cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                wchan = cmd = "?"
            rows.append(f"  {p} {parent[p][1]} {wchan} {cmd[:300]}")
    return "\n".join(rows) or "  none"


def _child(target, env: dict, out: Path, err: Path, new_session: bool) -> None:
    rc = 1
    try:
        if new_session:
            os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, out), (2, err)):
            f = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
        faulthandler.enable(sys.stderr)
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        import torch

        torch.set_num_threads(1)
        rc = int(target() or 0)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        rc = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


def fork_cli(argv: list[str], **kw) -> Forked:
    """``fathom ARGV`` in a forked child (see the module docstring)."""
    from fathom.cli import main

    return Forked(lambda: main(list(argv)), **kw)
