"""The state of a run as every output says it: ``running, 3 of 10 epochs``.

The manifest's ``status`` alone cannot tell a run being trained from one whose trainer was
killed (``kill -9``, a power cut): both say ``running``. The run's lock can: the kernel holds
it exactly as long as the writer's process lives (:func:`fathom.rundir.lock.lock_holder`).
So a run is

* ``running`` while a live process holds its lock (its outputs are a snapshot of an
  unfinished run, and say so);
* ``interrupted`` when its manifest says so (Ctrl-C or SIGTERM, recorded by the writer), or
  says ``running`` while no process holds the lock (``killed``: nothing could be recorded);
* else its recorded outcome (``complete``, ``diverged``, ``failed``).

Every output of a run that is not finished (terminal line, report header, export metadata)
carries :meth:`RunState.sentence`; an interrupted one names the command that continues it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fathom.rundir.lock import lock_holder
from fathom.rundir.record import RecordedConfig
from fathom.rundir.sections import UNFINISHED, Status

if TYPE_CHECKING:
    from fathom.rundir.reader import RunDir


@dataclass(frozen=True)
class RunState:
    """``status`` as said (see the module docstring), ``epochs_completed`` of ``epochs``
    planned (``None`` when the config names none), the live writer's ``pid`` while
    running, ``killed`` for a run whose writer died without recording anything."""

    run_dir: Path
    status: Status
    epochs_completed: int
    epochs: int | None
    pid: int | None = None
    killed: bool = False

    @property
    def finished(self) -> bool:
        """Whether the run has its final result (complete, diverged or failed)."""
        return self.status not in UNFINISHED

    @property
    def progress(self) -> str:
        """``3 of 10 epochs`` (``3 epochs`` when the planned number is unknown)."""
        of = f" of {self.epochs}" if self.epochs is not None else ""
        return f"{self.epochs_completed}{of} epochs"

    @property
    def resume_command(self) -> str:
        return f"fathom train --resume {self.run_dir}"

    def sentence(self) -> str:
        """``running, 3 of 10 epochs (...)``, ``interrupted, 3 of 10 epochs: continue with
        `fathom train --resume DIR``` or ``complete, 10 of 10 epochs``."""
        head = f"{self.status}, {self.progress}"
        if self.status == "running":
            holder = f"PID {self.pid}" if self.pid and self.pid > 0 else "another process"
            return f"{head} ({holder} is training it: what is shown is a snapshot)"
        if self.status == "interrupted":
            how = (
                " (its process ended without recording it: killed or crashed)"
                if self.killed
                else ""
            )
            return f"{head}{how}: continue with `{self.resume_command}`"
        return head


def run_state(rd: RunDir) -> RunState:
    """The state of the run ``rd`` (its manifest, and its lock for a ``running`` one)."""
    status: Status = rd.header.status
    pid = None
    killed = False
    if status == "running":
        pid = lock_holder(rd.path)
        if pid is None:
            status, killed = "interrupted", True
    return RunState(
        run_dir=rd.path,
        status=status,
        epochs_completed=rd.header.epochs_completed or 0,
        epochs=RecordedConfig.model_validate(rd.header.config).planned_epochs,
        pid=pid,
        killed=killed,
    )
