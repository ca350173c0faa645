"""Names the audit's command line and its pipeline step share, kept light (no numpy, no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fathom.errors import FathomError

if TYPE_CHECKING:
    from fathom.rundir import RunDir

CHECKPOINT_CHOICES: dict[str, tuple[str, ...]] = {
    "selected": ("selected",),
    "final": ("final",),
    "both": ("selected", "final"),
}
"""``--checkpoint`` value -> the checkpoints audited (the minimum-validation-CE one, the last, or both)."""


def find_audit_runs(target: Path) -> list[RunDir]:
    """The run directories of ``target`` (itself, or the runs of a study), or an error (read
    from the manifests alone: a wrong path is refused before torch is imported)."""
    from fathom.rundir import find_runs

    if not target.exists():
        raise FathomError(f"{str(target)!r} does not exist; pass a run or study directory")
    runs = find_runs(target)
    if not runs:
        raise FathomError(
            f"no run directories (manifest.json + history.jsonl) under {str(target)!r}; pass a run "
            "directory or a study directory that holds runs"
        )
    return runs
