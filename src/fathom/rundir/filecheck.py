"""Byte-level checks of a run directory's files, without torch (``fathom runs show``).

* :func:`stray_tmp_files`: ``.*.tmp`` files a killed atomic write left behind;
* :func:`weight_file_problems`: every weights file a manifest entry names, against the
  ``sha256`` of the whole file recorded in that entry (header and metadata included, see
  :mod:`fathom.rundir.files`). Equal file digests imply equal tensors, so a match needs no
  torch; a mismatch or a missing file is a problem. Entries without ``sha256`` (runs
  written before it was recorded) are left to the deep check, which loads the tensors
  (:meth:`fathom.rundir.reader.RunDir.problems` with ``deep=True``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fathom.base.io import sha256_file
from fathom.rundir.sections import UNFINISHED


def stray_tmp_files(run_dir: Path) -> list[Path]:
    """``.*.tmp`` files left in ``run_dir`` (or ``checkpoints/``) by a killed atomic write."""
    out: list[Path] = []
    for d in (run_dir, run_dir / "checkpoints"):
        if d.is_dir():
            out += sorted(p for p in d.glob(".*.tmp") if p.is_file())
    return out


def weight_file_problems(run_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """One sentence per epoch checkpoint (and the selected weights of a run that is not
    running: a running run may hold a newer selection of its own) whose file is missing or
    whose SHA-256 differs from the ``sha256`` its manifest entry records."""
    entries = [(f"epoch {e}", c) for e, c in (manifest.get("checkpoints") or {}).items()]
    if manifest.get("status") not in UNFINISHED and manifest.get("selected_checkpoint"):
        entries.append(("selected", manifest["selected_checkpoint"]))
    out = []
    for label, entry in entries:
        want = entry.get("sha256") if isinstance(entry, dict) else None
        if not want:
            continue
        path = run_dir / entry["file"]
        if not path.is_file():
            out.append(f"{label}: weights file {entry['file']} is missing")
            continue
        got = sha256_file(path)
        if got != want:
            out.append(
                f"{label}: weights file {entry['file']} fails its hash check (manifest "
                f"records sha256 {want}, the file hashes to {got}): the file was changed "
                "after it was written; retrain the run or restore the file"
            )
    return out
