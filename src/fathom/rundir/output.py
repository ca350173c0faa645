"""Analysis outputs (curvature, audit, report) written under the lock of what they write into.

An analysis writes ``<run>/curvature``, ``<target>/audit`` or ``<root>/report`` while a trainer
may be writing the same run directory. :func:`analysis_output` takes, for the whole of the
analysis, the lock of the directory the output lives in:

* inside a run directory (it holds ``manifest.json``): the run's own lock
  (:data:`~fathom.rundir.lock.RUN_LOCK`, the one a training writer holds), so an analysis is
  refused while ``fathom train`` / ``--resume`` writes that run, naming its PID, and a trainer is
  refused while the analysis writes;
* inside any other directory given as the target (a study, a folder of runs): its study lock
  (:func:`~fathom.rundir.lock.study_lock`, held by ``fathom study run`` for its whole run);
* elsewhere (``--out``): a lock of its own in the output directory (:data:`OUTPUT_LOCK`).

An output never leaves its tree (:func:`check_output_place`): not through a symbolic link out
of the target, and not into another run or study directory (``--out``).

So two analyses writing into one directory never interleave their files: the second is
refused at once, before it computes or writes anything. Every file is written atomically
(temporary file, fsync, rename) through :class:`AnalysisOutput`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fathom.base.io import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    ensure_writable_dir,
    fathom_tree,
)
from fathom.errors import FathomError
from fathom.rundir.lock import DirLock, study_lock

OUTPUT_LOCK = ".fathom-output.lock"


class AnalysisOutput:
    """The directory one analysis writes, held under its lock (see the module docstring)."""

    def __init__(self, directory: Path, lock: DirLock) -> None:
        self.dir = directory
        self.lock = lock

    def path(self, name: str) -> Path:
        """``dir/name``; ``name`` must stay inside the output directory."""
        target = (self.dir / name).resolve()
        if not target.is_relative_to(self.dir.resolve()):
            raise FathomError(f"output file {name!r} lies outside {str(self.dir)!r}")
        return self.dir / name

    def _writing(self, name: str) -> Path:
        if not self.lock.held:
            raise FathomError(
                f"the output {str(self.dir)!r} is closed: write inside `with analysis_output(...)`"
            )
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def json(self, name: str, obj: Any) -> Path:
        """Write ``obj`` as canonical JSON to ``dir/name`` (atomically)."""
        path = self._writing(name)
        atomic_write_json(path, obj)
        return path

    def text(self, name: str, text: str) -> Path:
        path = self._writing(name)
        atomic_write_text(path, text)
        return path

    def bytes(self, name: str, data: bytes) -> Path:
        path = self._writing(name)
        atomic_write_bytes(path, data)
        return path


def check_output_place(target: Path, directory: Path, name: str) -> None:
    """Refuse an output that would leave its tree: the one rule of every analysis output
    (report, export, audit, curvature).

    * an output inside ``target`` must stay there once symbolic links are followed (a run's
      ``report/`` linked elsewhere is refused, never written through);
    * an output (``--out``) never lands in another run or study directory: the nearest run or
      study directory at or above it (:func:`fathom.base.io.fathom_tree`) is ``target`` itself or none.
    """
    root = target.resolve()
    inside = directory.absolute().is_relative_to(target.absolute())
    if inside and not directory.resolve().is_relative_to(root):
        raise FathomError(
            f"the {name} output {str(directory)!r} is, or lies under, a symbolic link that "
            f"leads out of {str(target)!r} (to {str(directory.resolve())!r}): writes never "
            "leave a run or study directory. Remove the link, or pass --out to write "
            "elsewhere. Nothing was written"
        )
    owner = fathom_tree(directory)
    if owner is not None and owner != root:
        raise FathomError(
            f"--out {str(directory)!r} lies inside another run or study directory "
            f"({str(owner)!r}): an analysis of {str(target)!r} writes into its own directory "
            "or a directory of its own, never into another run's or study's. Choose an --out "
            "outside every run and study directory. Nothing was written"
        )


def _output_lock(target: Path, directory: Path) -> DirLock:
    """The lock that guards writing ``directory`` as an analysis of ``target``."""
    inside = directory.resolve().is_relative_to(target.resolve())
    if inside and (target / "manifest.json").exists():
        return DirLock(target)  # the run's own lock: the trainer's
    if inside:
        return study_lock(target)
    return DirLock(directory, name=OUTPUT_LOCK, what="output directory")


@contextmanager
def analysis_output(
    target: str | os.PathLike, name: str, out: str | os.PathLike | None = None
) -> Iterator[AnalysisOutput]:
    """Hold the lock for writing the analysis ``name`` of ``target`` into ``out`` (default
    ``target/name``) for the whole block; refuse at once, naming the holder's PID, while a
    trainer, a study or another analysis holds it. The output directory is checked to be
    writable before the block runs (a read-only run is refused before any computing)."""
    target = Path(target)
    directory = Path(out) if out is not None else target / name
    if not target.is_dir():
        raise FathomError(f"{str(target)!r} is not a directory; pass a run or study directory")
    check_output_place(target, directory, name)
    lock = _output_lock(target, directory)
    try:
        lock.acquire()
    except FathomError as e:
        if not hasattr(e, "holder_pid"):  # not a holder: the directory cannot be written
            ensure_writable_dir(directory)  # says so, with the option that moves the output
            raise
        raise FathomError(
            f"cannot write the {name} output {str(directory)!r} now: {e} Nothing was written"
        ) from None
    existed = directory.exists()
    try:
        ensure_writable_dir(directory)
        yield AnalysisOutput(directory, lock)
    except BaseException:
        lock.release()
        if not existed:  # a refused analysis leaves nothing behind, not even its directory
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty
        raise
    finally:
        lock.release()
