"""What a study's runs are doing now: ``fathom study run``'s live line between run lines.

The line is read from the run directories, never from a trainer's memory, so it is the same
for every backend (this process, local workers, Ray, Slurm on a shared file system): a run
is *training* while a live process holds its lock (:func:`fathom.rundir.run_state`; this
process too, for a study training its runs itself: :func:`fathom.rundir.lock.held_here`), and its
epoch is the manifest's ``epochs_completed`` + 1 of its planned epochs. A thread polls every
``every_s`` seconds and redraws a transient line on a terminal only (a log gets the study's
one line per run, as before).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fathom.errors import FathomError

_SHOWN = 3
"""Runs named on the line; more are counted (``+2 more``)."""


def training_now(root: Path) -> list[tuple[str, int, int | None]]:
    """``(run id, epoch under way, planned epochs)`` of each run under ``root`` that a live
    process is training now, in directory order."""
    from fathom.rundir import RunDir, run_state
    from fathom.rundir.lock import held_here

    out = []
    for manifest in sorted(Path(root).glob("*/manifest.json")):
        try:
            rd = RunDir(manifest.parent)
            if rd.status != "running":
                continue  # finished or recorded interrupted: no lock to probe
            state = run_state(rd)
        except (OSError, ValueError, FathomError):
            continue  # being written this instant, or damaged: the run's own line says so
        if state.status == "running" or held_here(manifest.parent):  # another process, or this
            epoch = state.epochs_completed + 1
            if state.epochs is not None:
                epoch = min(epoch, state.epochs)
            out.append((manifest.parent.name, epoch, state.epochs))
    return out


def training_line(runs: list[tuple[str, int, int | None]]) -> str:
    """``training: main-residual-s101 epoch 3/10, main-sd_linear-s101 epoch 2/10 +1 more``."""
    if not runs:
        return ""
    shown = [f"{r} epoch {e}{'' if n is None else f'/{n}'}" for r, e, n in runs[:_SHOWN]]
    more = f" +{len(runs) - _SHOWN} more" if len(runs) > _SHOWN else ""
    return f"training: {', '.join(shown)}{more}"


class StudyWatch:
    """A thread redrawing :func:`training_line` of ``root`` under a rich ``console`` (a
    terminal) every ``every_s`` seconds; :meth:`stop` ends it and removes the line."""

    def __init__(self, root: Path, console: Any, every_s: float = 2.0) -> None:
        self.root, self.console, self.every_s = Path(root), console, every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Any = None

    def start(self) -> StudyWatch:
        if not self.console.is_terminal:
            return self
        from rich.live import Live

        self._live = Live("", console=self.console, auto_refresh=False, transient=True)
        self._live.start()
        self._thread = threading.Thread(target=self._run, name="fathom-study-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        from rich.text import Text

        text = None
        while not self._stop.wait(self.every_s):
            line = training_line(training_now(self.root))
            if line != text and self._live is not None:
                self._live.update(Text(line), refresh=True)  # plain: no number highlighting
                text = line

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._live is not None:
            self._live.stop()
            self._live = None
