"""Which source code trained a study's runs: one code version per study, or said otherwise.

Every run records the hash of the package's source at its start (``source_hash``,
:func:`fathom.base.provenance.source_hash`) and, when it was resumed under
``--allow-source-change``, each later one (``source_changes``). A study rerun after a
source edit would otherwise mix runs of two code versions silently (complete runs are
skipped, the others trained by the new code): :func:`check_sources` refuses that unless
``--allow-source-change`` is given, and :func:`source_summary` lists the hashes of every
run in the summary, marking a study whose runs mix them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fathom.base.provenance import source_hash
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.study.plan import RunSpec


def _run_sources(path: str | Path) -> list[str]:
    """The source hashes a run directory was trained with (start, then each change)."""
    if not (Path(path) / "manifest.json").exists():
        return []
    recorded = RunDir(path).recorded
    changes = [c.source_hash for c in recorded.source_changes]
    return [h for h in [recorded.source_hash, *changes] if h]


def check_sources(specs: Sequence[RunSpec], allow_source_change: bool) -> None:
    """Refuse to add runs of the current source to runs of another unless allowed."""
    if allow_source_change:
        return
    current = source_hash()
    other = {
        s.run_id: hashes
        for s in specs
        if (hashes := _run_sources(s.run_dir)) and any(h != current for h in hashes)
    }
    if other:
        listed = ", ".join(f"{rid} ({hashes[-1][:12]})" for rid, hashes in sorted(other.items()))
        raise FathomError(
            f"{len(other)} run(s) of this study were trained by other source code than the "
            f"current one ({current[:12]}): {listed}; a rerun would mix code versions. Use "
            "another --runs-dir (or study name) to rerun the study with this code, restore "
            "that code, or pass --allow-source-change to continue anyway (the summary then "
            "lists the runs of each source hash)"
        )


def source_summary(specs: Sequence[RunSpec]) -> dict[str, Any]:
    """``{"hashes": {hash: [run ids]}, "mixed": bool, "sentence"}`` over ``specs``' runs."""
    by_hash: dict[str, list[str]] = {}
    for s in specs:
        for h in dict.fromkeys(_run_sources(s.run_dir)):
            by_hash.setdefault(h, []).append(s.run_id)
    mixed = len(by_hash) > 1
    if not by_hash:
        sentence = "No run records its source hash."
    elif not mixed:
        sentence = f"Every run was trained by one source version ({next(iter(by_hash))[:12]})."
    else:
        parts = "; ".join(f"{h[:12]}: {', '.join(ids)}" for h, ids in by_hash.items())
        sentence = (
            f"MIXED SOURCE: the runs were trained by {len(by_hash)} code versions ({parts}); "
            "comparisons across them may reflect the code change, not the recipes."
        )
    return {"hashes": by_hash, "mixed": mixed, "sentence": sentence}
