"""Ctrl-C at any point of an atomic write leaves no ``.*.tmp`` file and no torn target.

The property: for every Python event (call, line, return) of one
:func:`fathom.base.io.atomic_write_bytes`, tempfile's and pathlib's included, a SIGINT sent
to this process at that event ends with the target holding either its old bytes or its new
ones, no temporary file beside it, and a ``KeyboardInterrupt`` raised to the caller. The
counter-example that CI found (``test_sigint_from_another_process`` left
``.manifest.json.*.tmp``) is a SIGINT inside ``tempfile.mkstemp`` after it created the file
and before it returned the name: no ``try`` of the caller can remove a file whose name it
never received, so the write holds the interrupt back until it is done.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
from pathlib import Path

import pytest

from fathom.base.io import atomic_write_bytes
from test_train_sigint_anywhere import _call_traced

pytestmark = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)


def _events_of_one_write(path: Path, data: bytes) -> int:
    """How many trace events one write makes (the points a SIGINT may land at)."""
    events, _, _ = _call_traced(lambda: atomic_write_bytes(path, data), lambda *_: False, where="")
    return events


def _write_with_sigint_at(path: Path, data: bytes, at: int) -> tuple[bool, bool]:
    """One write with SIGINT sent to this process at trace event ``at``: whether it was sent
    (the write has that many events) and whether the ``KeyboardInterrupt`` reached the
    caller."""
    _, sent, outcome = _call_traced(
        lambda: atomic_write_bytes(path, data), lambda i, *_: i == at, where=""
    )
    return sent, isinstance(outcome, KeyboardInterrupt)


def _check_interrupted_write(directory: Path, target: Path, old: bytes, new: bytes, at: int):
    sent, raised = _write_with_sigint_at(target, new, at)
    assert raised == sent, f"event {at}: sent {sent}, raised {raised}"
    assert target.read_bytes() in (old, new), f"event {at}: torn target"
    left = sorted(p.name for p in directory.iterdir() if p != target)
    assert left == [], f"event {at}: {left} left behind"
    return sent


def test_sigint_at_every_point_of_an_atomic_write(tmp_path):
    target = tmp_path / "manifest.json"
    old, new = b"old\n" * 1000, b"new\n" * 2000
    target.write_bytes(old)
    gc.disable()  # a collection inside a write runs finalizers: events the count lacks
    try:
        _events_of_one_write(target, new)  # first-call work (caches) is not repeated
        n = _events_of_one_write(target, new)
        assert n > 20  # tempfile, pathlib and our own lines are traced
        sent = 0
        for at in range(n + 10):  # the last ones: past the end, nothing is sent
            target.write_bytes(old)
            sent += _check_interrupted_write(tmp_path, target, old, new, at)
    finally:
        gc.enable()
    assert sent >= n - 2  # (almost) every event of the write was a point of interruption


def test_sigint_inside_mkstemp_after_the_file_exists(tmp_path, monkeypatch):
    """The named counter-example: the interrupt lands after ``mkstemp`` created the file,
    before the caller has its name."""
    import tempfile

    real = tempfile.mkstemp

    def mkstemp_then_sigint(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # delivered before this frame returns
        _ = [i for i in range(10)]  # bytecodes: the handler runs here
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp_then_sigint)
    target = tmp_path / "manifest.json"
    target.write_bytes(b"old")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            atomic_write_bytes(target, b"new")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert target.read_bytes() == b"new"  # held back until the write was done
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
