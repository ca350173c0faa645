"""Byte-level checks of a run directory's files, without torch (``fathom runs show``).

* :func:`resume_file`: which resume state a run directory holds;
* :func:`check_run_dir`, :func:`refuse_links_out`: a writer never writes through a symbolic
  link out of the run;
* :func:`stray_tmp_files`: ``.*.tmp`` files a killed atomic write left behind;
* :func:`weight_file_problems`: every weights file a manifest entry names, against the
  ``sha256`` of the whole file recorded in that entry (header and metadata included, see
  :mod:`fathom.rundir.files`). Equal file digests imply equal tensors, so a match needs no
  torch; a mismatch or a missing file is a problem. Entries without ``sha256`` (runs
  written before it was recorded) are left to the deep check, which loads the tensors
  (:meth:`fathom.rundir.reader.RunDir.problems` with ``deep=True``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from fathom.base.io import sha256_file
from fathom.errors import FathomError
from fathom.rundir.header import ManifestHeader
from fathom.rundir.sections import UNFINISHED

RESUME_NAME = "resume.safetensors"
"""The resume state's file in ``checkpoints/`` (:func:`fathom.rundir.files.encode_resume`)."""
LEGACY_RESUME = "resume.pt"
"""The pickle-format resume state of older fathoms: read only by torch's weights-only
unpickler, converted on resume (:func:`fathom.rundir.files.load_legacy_resume`)."""


def resume_file(run_dir: Path) -> Path | None:
    """The resume state on disk: ``checkpoints/resume.safetensors``, else a ``resume.pt`` of
    an older fathom (:data:`LEGACY_RESUME`), else ``None``. The new file wins: a
    ``resume.pt`` beside it is never read."""
    for name in (RESUME_NAME, LEGACY_RESUME):
        if (Path(run_dir) / "checkpoints" / name).exists():
            return Path(run_dir) / "checkpoints" / name
    return None


_WRITTEN = ("manifest.json", "history.jsonl", "checkpoints")
"""What a run's writer writes into: none may be a symbolic link out of the run."""


def check_run_dir(run_dir: Path) -> None:
    """What a writer checks before it locks ``run_dir``: a directory (or nothing yet), and
    nothing it writes into a symbolic link out of it (:func:`refuse_links_out`)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise FathomError(
            f"{str(run_dir)!r} is a file, not a run directory; move it away or choose "
            "another --runs-dir/--name"
        )
    refuse_links_out(run_dir)


def refuse_links_out(
    root: Path, paths: Iterable[Path] | None = None, what: str = "run directory"
) -> None:
    """Refuse ``paths`` (default: a run's :data:`_WRITTEN` and the files in ``checkpoints/``)
    where one is a symbolic link that leads out of ``root``: a writer would write through it
    (history rows are appended in place, checkpoints and runs written into their folders)."""
    real = Path(root).resolve()
    if paths is None:
        ckpt = Path(root) / "checkpoints"
        inner = sorted(ckpt.iterdir()) if ckpt.is_dir() and not ckpt.is_symlink() else []
        paths = [*(Path(root) / name for name in _WRITTEN), *inner]
    for p in paths:
        if p.is_symlink() and not p.resolve().is_relative_to(real):
            raise FathomError(
                f"{str(p)!r} is a symbolic link that leads out of the {what} (to "
                f"{str(p.resolve())!r}): writes never leave a run or study directory. Replace "
                "the link by the file or folder itself (copy it in), then run again. Nothing "
                "was written"
            )


def stray_tmp_files(run_dir: Path) -> list[Path]:
    """``.*.tmp`` files left in ``run_dir`` (or ``checkpoints/``) by a killed atomic write."""
    out: list[Path] = []
    for d in (run_dir, run_dir / "checkpoints"):
        if d.is_dir():
            out += sorted(p for p in d.glob(".*.tmp") if p.is_file())
    return out


def weight_file_problems(run_dir: Path, header: ManifestHeader) -> list[str]:
    """One sentence per epoch checkpoint (and the selected weights of a run that is not
    running: a running run may hold a newer selection of its own) whose file is missing or
    whose SHA-256 differs from the ``sha256`` its manifest entry records (``header``: the
    run's typed :class:`fathom.rundir.header.ManifestHeader`, ``RunDir.header``)."""
    entries = [(f"epoch {e}", c) for e, c in header.checkpoints.items()]
    if header.status not in UNFINISHED and header.selected_checkpoint is not None:
        entries.append(("selected", header.selected_checkpoint))
    out = []
    for label, entry in entries:
        want = entry.sha256
        if not want:
            continue
        path = run_dir / entry.file
        if not path.is_file():
            out.append(f"{label}: weights file {entry.file} is missing")
            continue
        got = sha256_file(path)
        if got != want:
            out.append(
                f"{label}: weights file {entry.file} fails its hash check (manifest "
                f"records sha256 {want}, the file hashes to {got}): the file was changed "
                "after it was written; retrain the run or restore the file"
            )
    return out
