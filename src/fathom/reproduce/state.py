"""Which pipeline steps are complete: ``<study>/reproduce/pipeline.json``, verified on read.

A step's record holds the digest of its inputs (config, settings and the hashes of the files
it read) and the SHA-256 of every file it wrote. A step is *complete and verified* when its
record exists, its inputs digest equals the current one and every output file still has its
recorded hash; then it is skipped. Anything else (no record, changed inputs, an output
missing or modified) reruns the step, and the reason is said.

One pipeline at a time writes an output directory: :func:`pipeline_lock` is a
:class:`fathom.rundir.DirLock` on ``<root>/.fathom-reproduce.lock`` (a second ``fathom
reproduce`` on the same directory is refused naming the holder's PID); a lock left by a
killed pipeline is taken over and the takeover is recorded in ``pipeline.json``'s
``events`` (:meth:`PipelineState.note`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fathom.base.io import atomic_write_json, config_digest, sha256_file
from fathom.errors import FathomError
from fathom.rundir import DirLock

_FORMAT = 1
_REPRODUCE_LOCK = ".fathom-reproduce.lock"


def pipeline_lock(root: Path) -> DirLock:
    """The lock one ``fathom reproduce`` holds on its output directory ``root`` throughout."""
    return DirLock(root, name=_REPRODUCE_LOCK, what="reproduction output directory")


class PipelineState:
    """The step records of one pipeline, rooted at ``base`` (output paths are relative to it)."""

    def __init__(self, path: Path, base: Path, pipeline: str) -> None:
        self.path, self.base, self.pipeline = path, base, pipeline
        self.steps: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        if path.exists():
            try:
                data = json.loads(path.read_text())
                self.steps = dict(data["steps"])
                self.events = list(data.get("events", []))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise FathomError(
                    f"{str(path)!r} is corrupt; delete it (every step then reruns, skipping "
                    "complete runs by their own hashes)"
                ) from None

    def check(self, step: str, inputs: dict[str, Any]) -> tuple[bool, str]:
        """``(complete, reason)``: complete when the record matches and every output verifies."""
        rec = self.steps.get(step)
        if rec is None:
            return False, "not run yet"
        if rec.get("inputs") != config_digest(inputs):
            return False, "its inputs changed since it ran"
        for rel, digest in rec.get("outputs", {}).items():
            path = self.base / rel
            if not path.exists():
                return False, f"output {rel} is missing"
            if sha256_file(path) != digest:
                return False, f"output {rel} was modified"
        return (
            True,
            f"complete and verified ({len(rec.get('outputs', {}))} files match their SHA-256)",
        )

    def record(self, step: str, inputs: dict[str, Any], outputs: list[Path], wall_s: float) -> None:
        """Mark ``step`` complete with the hashes of ``outputs`` (written atomically)."""
        self.steps[step] = {
            "inputs": config_digest(inputs),
            "outputs": {str(p.relative_to(self.base)): sha256_file(p) for p in outputs},
            "wall_s": wall_s,
            "finished_at": time.time(),
        }
        self._write()

    def note(self, event: str, info: dict[str, Any]) -> None:
        """Append ``{"event", "at", **info}`` to the recorded events (a stale-lock takeover)."""
        self.events.append({"event": event, "at": time.time(), **info})
        self._write()

    def _write(self) -> None:
        atomic_write_json(
            self.path,
            {
                "format": _FORMAT,
                "pipeline": self.pipeline,
                "steps": self.steps,
                "events": self.events,
            },
        )

    def output_digest(self, step: str) -> str | None:
        """One digest of a complete step's outputs (an input of the steps that read them)."""
        rec = self.steps.get(step)
        return None if rec is None else config_digest(rec.get("outputs", {}))
