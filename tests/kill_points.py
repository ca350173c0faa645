"""Kill points for run-directory tests: a process death at an exact write, without signals.

:func:`kill_at` makes the ``n``-th ``os.replace`` (the commit of an atomic write) or
``os.fsync`` of a file whose name contains ``match`` raise :class:`Killed`, a
``BaseException`` the trainer does not catch: nothing runs after it but ``finally`` blocks
(the lock's release, which the kernel does for a killed process too), so the directory is
left exactly as a ``kill -9`` at that write would leave it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fathom.train.loop import train


class Killed(BaseException):
    """The process died here (raised by :func:`kill_at`)."""


def kill_at(monkeypatch: pytest.MonkeyPatch, op: str, match: str, n: int = 1) -> list[str]:
    """From now on, the ``n``-th ``op`` (``"replace"`` or ``"fsync"``) of a path containing
    ``match`` raises :class:`Killed` (``replace``: before the rename, so the old file stays;
    ``fsync``: after the write it would flush). Returns the paths ``op`` saw, in order."""
    real = getattr(os, op)
    seen: list[str] = []

    def fake(*args, **kw):
        name = os.fsdecode(args[1]) if op == "replace" else os.readlink(f"/proc/self/fd/{args[0]}")
        seen.append(name)
        if match in name and sum(1 for s in seen if match in s) == n:
            raise Killed(f"killed at {op} #{n} of {match!r}")
        return real(*args, **kw)

    monkeypatch.setattr(os, op, fake)
    return seen


def killed_run(
    monkeypatch: pytest.MonkeyPatch, cfg, run: Path, splits, op: str, match: str, n: int = 1
) -> Path:
    """Train ``cfg`` into ``run`` until the kill point; the kill must happen."""
    kill_at(monkeypatch, op, match, n)
    with pytest.raises(Killed):
        train(cfg, run, splits=splits)
    monkeypatch.undo()
    return run


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of ``run`` (the lock file aside) by relative path: a refusal changes none."""
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".fathom-run.lock"
    }


def copy_run(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest)
    return dest
