"""Steps that Ctrl-C does not cut in two: a write and the bookkeeping that records it.

A ``KeyboardInterrupt`` is raised between any two bytecodes, e.g. during the directory
fsync that follows the rename of a weights file: the file is then on disk while the
manifest still describes its predecessor, and a reader reports a digest mismatch.
:func:`uninterrupted` holds SIGINT back for such a step and raises the interrupt when the
step is done, so the run directory always describes the files it holds.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold back SIGINT until the block ends, then raise ``KeyboardInterrupt``.

    Only where Python's own SIGINT handler is installed and in the main thread (signals
    are delivered there only): under another handler (a nested block, an application's
    own) the block runs unchanged. An exception raised by the block wins over a held-back
    interrupt.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt
