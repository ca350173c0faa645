"""The one reader of run directories: every command reads a run through :class:`RunDir`.

Opening a run verifies its manifest (digest and contract fields, see
:mod:`fathom.rundir.manifest`); the config is validated by the type its ``kind`` names
(:func:`config_validator`). Everything else is checked when read: weights against the
file and tensor digests of their manifest entry, the history against the recorded
history digest. :meth:`RunDir.problems` lists every integrity problem found, so that a
report or a study can say what is wrong instead of silently reading around it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from fathom.base.io import read_jsonl
from fathom.errors import FathomError
from fathom.rundir.manifest import check_manifest, describe_recovery, read_recorded
from fathom.rundir.record import (
    AuditRecord,
    CurvatureRecord,
    CurvatureSummary,
    RecordedRun,
    RunManifest,
)
from fathom.rundir.sections import UNFINISHED, WeightsEntry

if TYPE_CHECKING:  # reading the manifest and history needs no torch (`fathom study status`)
    import torch
    from torch import nn

Which = int | Literal["selected", "final"]


# -- config families by manifest kind: the reader picks the validator from this table --------
Validator = Callable[[dict[str, Any], str], Any]


def _raw_config(data: dict[str, Any], origin: str = "config") -> dict[str, Any]:
    """The config as recorded (a kind without a validated config type)."""
    return dict(data)


_VALIDATORS: dict[str, str | Validator] = {
    "run": "fathom.config:validate_run_config",
    "depth_scaling": _raw_config,
}
"""Per manifest ``kind``, its config's validator (a ``"module:function"`` path is imported on
first use, so that opening a run imports no config model before it is asked for).
``depth_scaling`` is read only: the depth-scaling runner wrote manifests of that kind (formats
1 and 2, before it wrote ``run`` directories); no writer produces it now, and old run
directories that carry it still open, their config read as recorded."""


def config_validator(kind: str) -> Validator:
    """The validator of ``kind``, or a FathomError listing the known kinds."""
    if kind not in _VALIDATORS:
        raise FathomError(
            f"unknown run kind {kind!r}; known kinds: {', '.join(sorted(_VALIDATORS))}. "
            "The run directory was written by a newer or another tool"
        )
    target = _VALIDATORS[kind]
    if callable(target):
        return target
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


class RunDir:
    """A run directory on disk (``manifest.json``, ``history.jsonl``, ``checkpoints/``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        mpath = self.path / "manifest.json"
        if self.path.exists() and not self.path.is_dir():
            raise FathomError(f"{str(self.path)!r} is a file, not a run directory")
        if not mpath.exists():
            raise FathomError(
                f"{str(self.path)!r} is not a run directory (no manifest.json); "
                "pass a directory created by `fathom train` or `fathom study run`"
            )
        try:
            manifest = json.loads(mpath.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise FathomError(f"{str(mpath)!r} is corrupt ({e}); the run cannot be read") from None
        except OSError as e:
            from fathom.errors import os_error

            raise os_error(e, f"read {str(mpath)!r}") from None
        self.header = check_manifest(manifest, repr(str(mpath)))
        self.manifest: dict[str, Any] = manifest

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r}, status={self.status!r})"

    @property
    def run_id(self) -> str:
        return self.header.run_id

    @property
    def status(self) -> str:
        return self.header.status

    @property
    def kind(self) -> str:
        return self.header.kind

    @property
    def phase(self) -> str | None:
        """``"tuning"`` / ``"main"`` for a study's run, ``None`` for a lone run (a field)."""
        return self.header.phase

    @property
    def record(self) -> RunManifest:
        """The whole typed manifest (a ``run`` manifest of format 3 or later); an older or
        foreign one, read by its header alone, is refused naming why."""
        if not isinstance(self.header, RunManifest):
            raise FathomError(
                f"{str(self.path / 'manifest.json')!r} is a format-{self.header.format} manifest "
                f"of kind {self.kind!r}, read by its header alone: what is asked of it needs "
                "the typed manifest of a run trained by this fathom; train the run again"
            )
        return self.header

    @cached_property
    def recorded(self) -> RecordedRun:
        """What the manifest recorded that a resume verifies and an analysis compares
        (:class:`~fathom.rundir.record.RecordedRun`), read the same way from every format: a
        field an older manifest lacks is absent, never a default that would compare."""
        return read_recorded(self.manifest, repr(str(self.path / "manifest.json")))

    @cached_property
    def config(self) -> Any:
        """The config, validated by the type of this run's ``kind``."""
        return config_validator(self.kind)(self.header.config, f"{self.path}/manifest.json")

    # -- history -------------------------------------------------------------------------
    def history(self) -> list[dict[str, Any]]:
        rows, _ = read_jsonl(self.path / "history.jsonl")
        return rows

    def history_with_errors(self) -> tuple[list[dict[str, Any]], list[int]]:
        """Rows plus the line numbers of truncated or unparsable lines."""
        return read_jsonl(self.path / "history.jsonl")

    def history_problems(self) -> list[str]:
        """What is wrong with ``history.jsonl`` against the recorded digest (empty: intact)."""
        path = self.path / "history.jsonl"
        if not path.exists():
            return ["history.jsonl is missing"]
        data = path.read_bytes()
        _, bad = read_jsonl(path)
        out = [f"history.jsonl line {n} is torn (truncated or unparsable)" for n in bad]
        if self.header.integrity is None:
            return out
        rec = self.header.integrity.history
        n = rec.bytes
        if len(data) < n:
            out.append(
                f"history.jsonl is shorter than its writer recorded ({len(data)} of {n} bytes, "
                f"{rec.rows} rows): rows were lost"
            )
        elif hashlib.sha256(data[:n]).hexdigest() != rec.sha256:
            out.append("history.jsonl fails its digest check: its rows were modified")
        elif len(data) > n and self.status not in UNFINISHED:
            out.append(
                f"history.jsonl has {len(data) - n} bytes after the last recorded row "
                f"({rec.rows} rows recorded); they were appended by another writer"
            )
        return out

    # -- analysis outputs ----------------------------------------------------------------
    def curvature(self, notes: list[str] | None = None) -> CurvatureRecord | None:
        """This run's curvature snapshots (:func:`read_curvature`); ``None`` when none."""
        return read_curvature(self.path, notes)

    def audit(self, notes: list[str] | None = None) -> AuditRecord | None:
        """This run's own ``audit/audit.json`` (:func:`read_audit`); ``None`` when absent."""
        return read_audit(self.path, notes)

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoint_epochs(self) -> list[int]:
        return sorted(int(e) for e in self.header.checkpoints)

    def _entry(self, which: Which) -> tuple[WeightsEntry, int]:
        if which == "selected":
            sel = self.header.selected_checkpoint
            if sel is None:
                raise FathomError(
                    f"run {self.run_id!r} has no selected checkpoint (no validation evaluation yet)"
                )
            return sel, int(sel.epoch)  # the header refuses a selected entry without its epoch
        if which == "final":
            epoch = self.recorded.final.epoch
            if epoch is None:
                raise FathomError(
                    f"run {self.run_id!r} has no final checkpoint (status {self.status!r}); "
                    "it is incomplete: resume it with `fathom train --resume`"
                )
            which = int(epoch)
        entry = self.header.checkpoints.get(str(int(which)))
        if entry is None:
            raise FathomError(
                f"run {self.run_id!r} has no checkpoint for epoch {which}; saved epochs: "
                f"{self.checkpoint_epochs()} (set checkpoints.save_epochs to keep more)"
            )
        return entry, int(which)

    def checkpoint_hash(self, which: Which) -> str:
        return self._entry(which)[0].params_sha256

    def checkpoint_epoch(self, which: Which) -> int:
        return self._entry(which)[1]

    def verify_entry(self, entry: WeightsEntry | dict[str, Any]) -> dict[str, torch.Tensor]:
        """Load the weights of a manifest entry (typed, or its JSON object), checking file and
        tensor digests."""
        from fathom.rundir import files

        if not isinstance(entry, WeightsEntry):
            try:
                entry = WeightsEntry.model_validate(entry)
            except ValidationError as e:
                raise FathomError(
                    f"a weights entry of run {self.run_id!r} is malformed ({e.errors()[0]['msg']}: "
                    f"{entry!r}); the file listing it was not written by this fathom: train the run again"
                ) from None
        state, _ = files.load_weights(self.path / entry.file, entry.params_sha256, entry.sha256)
        return state

    def load_state(self, which: Which) -> dict[str, torch.Tensor]:
        entry, _ = self._entry(which)
        return self.verify_entry(entry)

    def problems(self, *, deep: bool = False) -> list[str]:
        """Every integrity problem found: unverified manifest, history, stray temp files, and
        (``deep``) every checkpoint and the resume state against their digests."""
        from fathom.rundir.filecheck import stray_tmp_files

        out = []
        if self.header.integrity is None:
            out.append("manifest.json has no digest (not written by this fathom); unverified")
        out += self.history_problems()
        out += [
            f"{p.relative_to(self.path)} is a leftover of a killed write"
            for p in stray_tmp_files(self.path)
        ]
        if deep:
            from fathom.rundir import files

            for entry in self.header.checkpoints.values():
                try:
                    self.verify_entry(entry)
                except FathomError as e:
                    out.append(str(e))
            out += self._selected_problems()
            resume = files.resume_file(self.path)
            if resume is not None:
                try:
                    self._resume_agrees(files.load_resume(resume))
                except FathomError as e:
                    out.append(str(e))
        return out

    def _resume_agrees(self, state: dict[str, Any]) -> None:
        """Raise unless the resume state agrees with this manifest's own record
        (:func:`fathom.rundir.resume.verify_against_manifest`: not a twin's)."""
        from fathom.rundir.resume import verify_against_manifest

        path = self.path / "history.jsonl"
        history = path.read_bytes() if path.exists() else None
        verify_against_manifest(state, self.recorded, history, self.path)

    def _selected_problems(self) -> list[str]:
        """The selected weights against their entry. A running run stopped inside an epoch
        may hold a later selection of its own (not yet committed, see
        :func:`fathom.rundir.resume.newer_selected`): that is its normal state, not damage."""
        from fathom.rundir import files
        from fathom.rundir.resume import newer_selected

        entry = self.header.selected_checkpoint
        if entry is None:
            return []
        try:
            self.verify_entry(entry)
            return []
        except FathomError as e:
            problem = str(e)
        if self.status in UNFINISHED:  # cut inside an epoch: may hold a newer selection
            try:
                _state, meta = files.load_weights(self.path / entry.file)
            except FathomError as e:
                return [str(e)]
            if newer_selected(meta, self.recorded, entry.epoch):
                return []
        return [problem]

    def recovery(self) -> list[dict[str, Any]]:
        """What writers found and repaired in this run (``manifest["recovery"]``), in order:
        each ``{"event", ...details}`` (see ``docs/architecture.md``, Integrity)."""
        return [e.model_dump(mode="json") for e in self.header.recovery]

    def recovery_notes(self) -> list[str]:
        """:meth:`recovery` as sentences (:func:`fathom.rundir.manifest.describe_recovery`)."""
        return [describe_recovery(e) for e in self.recovery()]

    # -- models and data (kind "run") ----------------------------------------------------
    @property
    def data_info(self) -> dict[str, Any]:
        """``data.info``: what the data source recorded about itself (open, per source), as
        recorded; typed: ``recorded.data.info`` (:class:`~fathom.rundir.record.RecordedInfo`)."""
        return self.recorded.data.info.as_json()

    @property
    def classes(self) -> int:
        """How many classes the run's model outputs: ``data.info.classes`` as recorded (every
        run of this fathom records it); an older manifest without it takes its registered
        dataset's (:func:`fathom.data.registry.registered_shape`), any other is refused
        naming the fix, never a default."""
        self._require_kind("its class count")
        classes = self.recorded.data.info.classes
        if classes is None:
            from fathom.data.registry import registered_shape

            missing = f"run {self.run_id!r}: data.info.classes"
            classes, _ = registered_shape(self.config.data.dataset, missing)
        return classes

    def _require_kind(self, what: str) -> None:
        if self.kind != "run":
            raise FathomError(
                f"run {self.run_id!r} is of kind {self.kind!r}; {what} is available for "
                "kind 'run' runs (fathom train / fathom study run)"
            )

    def build_model(
        self, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> nn.Module:
        """The run's model by ``model.kind``, shaped by the recorded data (``data.info``:
        classes, in_features, input_shape; a manifest without them takes a registered
        dataset's, and is refused for other data); ``dtype`` default float32."""
        self._require_kind("rebuilding its model")
        import torch

        from fathom.models import build_model

        info = self.recorded.data.info
        model = build_model(
            self.config.model,
            info.classes,
            info.in_features,
            input_shape=tuple(info.input_shape) if info.input_shape else None,
            dataset=self.config.data.dataset,
        )
        return model.to(device=device, dtype=dtype or torch.float32)

    def load_model(
        self, which: Which, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> nn.Module:
        """The model at a checkpoint, hash-verified, in eval mode (``dtype`` default float32)."""
        import torch

        from fathom.rundir.weights import load_cpu_state

        state = self.load_state(which)
        model = self.build_model(torch.float32, "cpu")
        load_cpu_state(model, state)
        if self.config.depth.convention != "inverse":  # huang: p as trained at that epoch
            from fathom.models import convention_at_checkpoint

            convention_at_checkpoint(model, self.config, self.checkpoint_epoch(which))
        return model.to(device=device, dtype=dtype or torch.float32).eval()

    def load_splits(self, device: str | torch.device = "cpu"):
        """The run's data splits, re-derived from its config (relative data paths resolved
        from any working directory) and checked against the recorded data content, files and
        split (:func:`fathom.rundir.inputs.verified_splits`)."""
        self._require_kind("re-deriving its data splits")
        from fathom.rundir.inputs import verified_splits

        return verified_splits(self.recorded, self.config.data, self.path, device)


_JSON_KINDS = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _read_json_object(path: Path, notes: list[str] | None) -> dict[str, Any] | None:
    """The JSON object in ``path``; ``None`` when absent. Unreadable (not JSON, not an object):
    appended to ``notes`` and ``None`` when ``notes`` is given, else a :class:`FathomError`."""
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        value, problem = None, f"does not parse ({e})"
    else:
        kind = _JSON_KINDS.get(type(value), type(value).__name__)
        problem = None if isinstance(value, dict) else f"holds a JSON {kind}, not an object"
    if problem is None:
        return value
    if notes is None:
        raise FathomError(f"{path} {problem}; rerun the step that writes it, or delete it")
    notes.append(f"{path} {problem}; it is left out of the report")
    return None


def read_curvature(run_path: str | Path, notes: list[str] | None = None) -> CurvatureRecord | None:
    """``<run_path>/curvature/`` as a :class:`CurvatureRecord` (``summary.json`` and every
    ``epoch-NNNN.json``); ``None`` when it holds neither. Unreadable files: see
    :func:`_read_json_object` (noted and left out with ``notes``, else refused)."""
    d = Path(run_path) / "curvature"
    summary = _read_json_object(d / "summary.json", notes)
    epochs: dict[int, dict[str, Any]] = {}
    for p in sorted(d.glob("epoch-*.json")):
        value = _read_json_object(p, notes)
        if value is not None:
            epochs[int(p.stem.split("-")[1])] = value
    if summary is None and not epochs:
        return None
    return CurvatureRecord(
        summary=None if summary is None else CurvatureSummary.from_json(summary), epochs=epochs
    )


def read_audit(root: str | Path, notes: list[str] | None = None) -> AuditRecord | None:
    """``<root>/audit/audit.json`` (a run's or a study's) as an :class:`AuditRecord`; ``None``
    when absent. Unreadable, or a row of ``runs`` of the wrong shape: noted with ``notes``
    (and ``None``), else refused (:func:`_read_json_object`)."""
    path = Path(root) / "audit" / "audit.json"
    data = _read_json_object(path, notes)
    if data is None:
        return None
    try:
        return AuditRecord.from_json(data, str(path))
    except FathomError as e:
        if notes is None:
            raise
        notes.append(f"{e}; it is left out of the report")
        return None


def find_runs(root: str | Path) -> list[RunDir]:
    """Every run directory at or below ``root`` (by its manifest.json), sorted by path; one
    whose history is missing is included (``problems()`` names it), never skipped."""
    root = Path(root)
    if (root / "manifest.json").exists():
        return [RunDir(root)]
    return [RunDir(p.parent) for p in sorted(root.rglob("manifest.json"))]
