"""Steps that Ctrl-C does not cut in two: a write and the bookkeeping that records it.

A ``KeyboardInterrupt`` is raised between any two bytecodes, e.g. during the directory
fsync that follows the rename of a weights file: the file is then on disk while the
manifest still describes its predecessor, and a reader reports a digest mismatch.
:func:`uninterrupted` holds SIGINT back for such a step and raises the interrupt when the
step is done, so the run directory always describes the files it holds. Every atomic
write (:func:`fathom.base.io.atomic_write_bytes`) is such a step: an interrupt that lands
inside ``tempfile.mkstemp``, after the file exists and before its name is returned, would
leave a ``.*.tmp`` file that no ``except`` of the writer can name.

:func:`sigterm_interrupts` makes SIGTERM (``kill PID``, a scheduler's stop) a
``KeyboardInterrupt`` too, for the duration of a command: the run then records
``interrupted`` as on Ctrl-C, and :func:`uninterrupted` holds it back the same way.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_HELD = (signal.SIGINT, signal.SIGTERM)
"""The signals :func:`uninterrupted` holds back where they raise ``KeyboardInterrupt``."""


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold back SIGINT (and SIGTERM under :func:`sigterm_interrupts`) until the block ends,
    then raise ``KeyboardInterrupt``.

    Only in the main thread (signals are delivered there only), and only a signal whose
    handler is Python's own ``default_int_handler``: under another handler (a nested block,
    an application's own) it is left alone. An exception raised by the block wins over a
    held-back interrupt.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = [s for s in _HELD if signal.getsignal(s) is signal.default_int_handler]
    held: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: held.append(signum)) for s in ours}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if held:
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises ``KeyboardInterrupt`` like SIGINT (main thread and
    a default SIGTERM disposition only; the previous handler is restored afterwards)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def cut_by_interrupt(e: BaseException) -> bool:
    """Whether ``e`` is a Ctrl-C in disguise. pydantic turns a ``KeyboardInterrupt`` raised
    inside a Python serializer (a ``model_serializer`` of a config or a manifest section)
    into a ``PydanticSerializationError``: with the interrupt as its ``__cause__`` when that
    serializer is the outermost, with only its name in the message ("Error calling function
    `_dump`: KeyboardInterrupt: ") when it runs inside another one. Such an error is the
    interrupt, never a failure of the run (``tests/test_train_sigint_anywhere.py``)."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        if type(cause).__name__ == "PydanticSerializationError" and (
            ": KeyboardInterrupt:" in str(cause)
        ):
            return True
        seen.add(id(cause))
        cause = cause.__cause__
    return False


@contextlib.contextmanager
def interrupts_unwrapped() -> Iterator[None]:
    """Within the block, a Ctrl-C in disguise (:func:`cut_by_interrupt`) is raised as the
    ``KeyboardInterrupt`` it is, so that the handlers of Ctrl-C outside it see one (also a
    decorator: ``@interrupts_unwrapped()``)."""
    try:
        yield
    except Exception as e:
        if cut_by_interrupt(e):
            raise KeyboardInterrupt from e
        raise
