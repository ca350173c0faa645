"""Audit run directories: one run, or every run of a study (found by its manifest.json).

Outputs, under ``out_dir`` (default ``<target>/audit``):

* ``audit.json``: settings, every run's per-checkpoint tables (with run id, epoch and the
  checkpoint's ``params_sha256``), reduced-network timings, and the across-seed aggregate;
* ``audit.md``: the same numbers as tables and computed sentences;
* ``<run-id>/<checkpoint>.npz``: per-example logits, correctness and margins per mask.

**Subjects.** A *subject* (:class:`Subject`) is one run directory seen by the audit: its
model at a checkpoint (input preparation included, so the model takes the split's stored
examples), its data splits (re-derived and checked against the recorded split hash), its arm
family, its seed, and whether it has any :class:`fathom.depth.SkippableResidual` branch to
remove. Every run is of manifest kind ``run``, its model rebuilt by ``model.kind``
(:func:`fathom.models.build_model`, input preparation included):

* the Ciresan MLP (``fathom train``, ``fathom study run``): family = recipe;
* a depth-scaling run (``fathom depth-scaling``, :class:`fathom.models.convnet.StagedConvNet`,
  ANN or spiking): family = ``staged_conv-<arm>-d<depth>``; removable only when trained
  with ``residual = true``;
* a user's ``python`` model: removable when it has SkippableResidual branches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fathom.audit.aggregate import aggregate
from fathom.audit.checkpoint import AuditSettings, audit_checkpoint, choose_masks
from fathom.audit.masks import full_mask_index, mask_label, removable_branch_count
from fathom.audit.options import find_audit_runs
from fathom.audit.progress import AuditProgress
from fathom.audit.report import lm_markdown, to_markdown
from fathom.audit.router import require_sklearn
from fathom.audit.speed import time_masks
from fathom.base.io import config_digest, ensure_writable_dir
from fathom.base.terminal import Say, Throttle
from fathom.config.model_kinds import model_kind
from fathom.depth import SkippableResidual
from fathom.errors import FathomError
from fathom.losses.labels import LabelLoss
from fathom.rundir import RunDir, Which
from fathom.rundir.output import AnalysisOutput, analysis_output
from fathom.stats import failure_flags

_FORMAT = 1


@dataclass(frozen=True)
class Subject:
    """One run directory as the audit sees it (module docstring: subjects)."""

    rd: RunDir
    kind: str
    family: str
    seed: int
    classes: int
    removable_reason: str | None  # None when the model has branches to remove
    tokens: bool = False  # a language model ([N, T, V] logits): audited per token

    def load_model(self, which: Which, device: torch.device) -> nn.Module:
        """The hash-verified model at checkpoint ``which``, float32, in eval mode."""
        return self.rd.load_model(which, dtype=torch.float32, device=device)

    def load_splits(self, device: torch.device) -> Any:
        """The run's splits, re-derived and checked against the recorded split hash."""
        return self.rd.load_splits(device)

    @property
    def config_for_digest(self) -> dict[str, Any]:
        """The run's config without seed and name (what makes two arms differ)."""
        cfg = dict(self.rd.header.config)
        cfg.pop("seed", None)
        cfg.pop("name", None)
        return cfg


def _family(cfg: Any) -> str:
    """The model kind's audit label (its row's ``label``): Ciresan, the recipe; a
    depth-scaling run, ``staged_conv-<arm>-d<depth>``; a user's model, ``python-<factory>``."""
    return model_kind(cfg.model.kind).label(cfg.model, cfg.tags)


def subject_of(rd: RunDir) -> Subject:
    """The subject of a run directory (any model kind); other manifest kinds refused."""
    if rd.kind != "run":
        raise FathomError(
            f"run {rd.run_id!r} has manifest kind {rd.kind!r}; the audit reads runs trained by "
            "`fathom train`, `fathom study run` and `fathom depth-scaling` (kind 'run')"
        )
    cfg = rd.config
    reason = None
    if not any(isinstance(m, SkippableResidual) for m in rd.build_model().modules()):
        why = model_kind(cfg.model.kind).no_branches(cfg.model)
        reason = (
            f"its model ({_family(cfg)}) has no removable branches (no SkippableResidual "
            "branch); audit a residual recipe (or a depth-scaling run with --residual)"
            if why is None
            else f"its model ({_family(cfg)}) has no removable branches: {why}"
        )
    tokens = model_kind(cfg.model.kind).tokens
    return Subject(rd, "run", _family(cfg), cfg.seed, rd.classes, reason, tokens)


def _arm_names(subjects: list[Subject]) -> dict[str, str]:
    """Arm of each run: its family, or family#digest when a family repeats a seed."""
    seen: dict[tuple[str, int], int] = {}
    for sub in subjects:
        key = (sub.family, sub.seed)
        seen[key] = seen.get(key, 0) + 1
    clash = {family for (family, _), n in seen.items() if n > 1}
    names = {}
    for sub in subjects:
        name = sub.family
        if name in clash:
            name = f"{name}#{config_digest(sub.config_for_digest)[:8]}"
        names[sub.rd.run_id] = name
    return names


def _measure_speed(
    model: torch.nn.Module, x: torch.Tensor, settings: AuditSettings
) -> list[dict[str, Any]]:
    """:func:`fathom.audit.speed.time_masks` at each batch size (capped at the split size)."""
    k = removable_branch_count(model)
    masks = choose_masks(k, settings)
    full = full_mask_index(masks)
    out = []
    for b in settings.timing_batch_sizes:
        batch = x[: min(b, x.shape[0])]
        t = time_masks(model, batch, masks, full, settings.timing_repeats, seed=settings.seed)
        entry = t.to_dict()
        entry["masks"] = [mask_label(r) for r in masks]
        out.append(entry)
    return out


def _architecture(model: torch.nn.Module) -> str:
    """``ClassName(widths)`` of the network (behind its input preparation, if any)."""
    from fathom.models.prep import ImageInput

    net = model.net if isinstance(model, ImageInput) else model
    depth = f", depth {net.depth}" if hasattr(net, "depth") else ""
    return f"{type(net).__name__}{tuple(getattr(net, 'widths', ()))}{depth}"


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise FathomError(f"device {name!r} requested but CUDA is not available; use --device cpu")
    return torch.device(name)


def audit_runs(
    target: str | Path,
    settings: AuditSettings,
    out_dir: str | Path | None = None,
    *,
    splits: Any = None,
    progress: Say | None = None,
    mask_progress: Say | None = None,
) -> dict[str, Any]:
    """Audit ``target`` (a run or a study directory); write and return ``audit.json``'s dict.

    ``progress`` gets a line per step and per checkpoint (k/N with an ETA); ``mask_progress``
    (a terminal's: the CLI gives it only to a TTY) also a line per mask pass with the
    checkpoint's ETA, at most one every 2 s.

    ``splits`` overrides the data a run would re-derive from its config (tests, synthetic
    data); otherwise each distinct recorded split hash is loaded once and verified. The
    output is written under the lock of the run or study it lives in
    (:func:`fathom.rundir.output.analysis_output`): refused, before any work, while a trainer,
    a study or another analysis writes there.
    """
    t0 = time.perf_counter()
    target = Path(target)
    runs = find_audit_runs(target)
    if settings.router:
        require_sklearn()
    with analysis_output(target, "audit", out_dir) as output:
        return _audit_runs(target, runs, settings, output, splits, progress, t0, mask_progress)


def _audit_runs(
    target: Path,
    runs: list[Any],
    settings: AuditSettings,
    output: AnalysisOutput,
    splits: Any,
    progress: Say | None,
    t0: float,
    mask_progress: Say | None = None,
) -> dict[str, Any]:
    audit = _Audit(
        target=target,
        single=(target / "manifest.json").exists(),
        settings=settings,
        out=output.dir,
        device=_resolve_device(settings.device),
        say=progress or (lambda _msg: None),
        splits=splits,
        mask_say=Throttle(mask_progress) if mask_progress is not None else None,
    )
    if not audit.single:  # a study's tuning grid selects learning rates; it is not an arm
        audit.skipped += [
            {"run_id": rd.run_id, "reason": "tuning-phase run (learning-rate selection)"}
            for rd in runs
            if rd.phase == "tuning"
        ]
        runs = [rd for rd in runs if rd.phase != "tuning"]
    subjects = [subject_of(rd) for rd in runs]
    lm = _language_models(subjects)
    n_ckpt = len(settings.checkpoints)
    arms = _arm_names(subjects)
    kept = [sub for sub in subjects if audit._skip_reason(sub) is None]
    planned: dict[str, int] = {}
    for sub in kept:
        planned[arms[sub.rd.run_id]] = planned.get(arms[sub.rd.run_id], 0) + n_ckpt
    audit.tally = AuditProgress(
        audit.say,
        total=len(subjects) * n_ckpt,
        planned=planned,
        data_loads=0 if splits is not None else len({audit.split_key(sub) for sub in kept}),
    )
    records = [r for sub in subjects if (r := audit.run(sub, arms[sub.rd.run_id])) is not None]
    audit.tally.phase("aggregate")
    result = {
        "format": _FORMAT,
        "kind": "run" if audit.single else "study",
        "target": str(target),
        "settings": settings.to_dict(),
        "environment": {
            "torch": torch.__version__,
            "numpy": np.__version__,
            "device": str(audit.device),
            "threads": torch.get_num_threads(),
        },
        "runs": records,
        "skipped": audit.skipped,
        "speed": audit.speed,
        "aggregate": {} if lm else aggregate(records, settings.checkpoints),
        "wall_s": None,
    }
    if lm:
        result["model"] = "language model"
    audit.tally.phase("write")
    result["wall_s"] = time.perf_counter() - t0
    output.json("audit.json", result)
    output.text("audit.md", lm_markdown(result) if lm else to_markdown(result))
    audit.tally.finish()
    return result


def _language_models(subjects: list[Subject]) -> bool:
    """True when every run is a language model (audited per token); a mix is refused."""
    kinds = {sub.tokens for sub in subjects}
    if len(kinds) > 1:
        lms = [sub.rd.run_id for sub in subjects if sub.tokens]
        raise FathomError(
            f"the study mixes language-model runs ({', '.join(lms[:3])}) with classifiers; "
            "their audits measure different things (nats per token against class CE and "
            "accuracy): audit each run directory on its own"
        )
    return kinds == {True}


@dataclass
class _Audit:
    """One ``audit_runs`` invocation: its settings and what its runs accumulate.

    A single run (``single``) is strict: anything that stops its audit is an error. In a
    study, such a run is skipped with its reason, and a checkpoint that cannot be loaded
    is recorded as missing.
    """

    target: Path
    single: bool
    settings: AuditSettings
    out: Path
    device: torch.device
    say: Say
    splits: Any  # data overriding every run's own splits (tests, synthetic data), or None
    skipped: list[dict[str, str]] = field(default_factory=list)
    speed: list[dict[str, Any]] = field(default_factory=list)
    _split_cache: dict[str, Any] = field(default_factory=dict)
    _timed: set[str] = field(default_factory=set)
    tally: AuditProgress | None = None  # each phase, k/N checkpoints, the audit's ETA
    mask_say: Throttle | None = None  # per mask pass, throttled (a terminal only)

    def _mask_ticker(self, run_id: str, which: str) -> Callable[[int, int], None] | None:
        """``on_mask(done, total)`` for one checkpoint: its k/N mask passes with an ETA."""
        if self.mask_say is None:
            return None

        def tick(done: int, total: int) -> None:
            what = (
                f"{done}/{total} mask passes (val + test)"
                if done < total
                else "tables, interactions, resilience, router (fit, permutation control, "
                "routed timing)"
            )
            line = f"    {run_id} {which}: {what}"
            if self.tally is not None:
                line = f"    {run_id} {which}: {self.tally.state(what)}"
            self.mask_say(line)

        return tick

    def _count(self, worked: bool, n: int = 1, arm: str | None = None) -> None:
        """Count ``n`` checkpoints done (``worked``: audited now; else missing, of ``arm``,
        or of a skipped run); say ``k/N`` with the audit's ETA after work."""
        if self.tally is not None:
            self.tally.counted(worked, n, arm)

    def run(self, sub: Subject, arm: str) -> dict[str, Any] | None:
        """The record of one run, every requested checkpoint audited (None: skipped)."""
        reason = self._skip_reason(sub)
        if reason is not None:
            self.skipped.append({"run_id": sub.rd.run_id, "reason": reason})
            self._count(False, len(self.settings.checkpoints))
            return None
        rd = sub.rd
        data = self._splits_for(sub)
        record: dict[str, Any] = {
            "run_id": rd.run_id,
            "path": str(rd.path.resolve().relative_to(self.target.resolve()))
            if not self.single
            else ".",
            "arm": arm,
            "recipe": sub.family,
            "seed": sub.seed,
            "status": rd.status,
            "config_hash": rd.record.config_hash,
            "split_hash": rd.record.data.split_hash,
            "checkpoints": {},
            "flags": {},
        }
        for which in self.settings.checkpoints:
            self._checkpoint(sub, which, data, record)
        return record

    def _skip_reason(self, sub: Subject) -> str | None:
        """Why ``sub`` cannot be audited (raised for a single run), or None."""
        rd = sub.rd
        if self.single and rd.status != "complete" and "final" in self.settings.checkpoints:
            raise FathomError(
                f"run {rd.run_id!r} is incomplete (status {rd.status!r}, "
                f"{rd.header.epochs_completed} of {rd.config.optim.epochs} epochs): it has no final "
                f"checkpoint. Resume it first (fathom train --resume {rd.path}) or audit its "
                "selected checkpoint only (--checkpoint selected)"
            )
        if rd.status != "complete" and not self.single:
            return f"status {rd.status!r}, not complete"
        if sub.removable_reason is not None and self.single:
            raise FathomError(f"run {rd.run_id!r}: {sub.removable_reason}")
        return sub.removable_reason

    def _splits_for(self, sub: Subject) -> Any:
        """The override, else the run's own splits, loaded (and verified) once per recorded
        split hash and content digest."""
        if self.splits is not None:
            return self.splits
        key = self.split_key(sub)
        if key not in self._split_cache:
            if self.tally is not None:
                self.tally.phase("data", f" for {sub.rd.run_id}")
            else:
                self.say(f"loading data splits for {sub.rd.run_id}")
            self._split_cache[key] = sub.load_splits(self.device)
        return self._split_cache[key]

    @staticmethod
    def split_key(sub: Subject) -> str:
        """One key per recorded split hash and content digest (loaded once each)."""
        data = sub.rd.record.data
        return f"{sub.kind}:{data.split_hash}:{data.tensors_sha256}"

    def _checkpoint(self, sub: Subject, which: str, data: Any, record: dict[str, Any]) -> None:
        """Audit checkpoint ``which`` into ``record`` (its arrays into ``<run-id>/<which>.npz``)."""
        rd = sub.rd
        try:
            model = sub.load_model(which, self.device)
            digest = rd.checkpoint_hash(which)
            epoch = rd.checkpoint_epoch(which)
        except FathomError as e:
            if self.single:
                raise
            record["checkpoints"][which] = {"missing": str(e)}
            self._count(False, arm=record["arm"])
            return
        label = f"{rd.run_id} at {which} checkpoint (epoch {epoch})"
        if self.tally is not None:
            self.tally.checkpoint(label, record["arm"])
        else:
            self.say(f"auditing {label}")
        arrays = self.out / rd.run_id / f"{which}.npz"
        ensure_writable_dir(arrays.parent)
        meta = {
            "run_id": rd.run_id,
            "checkpoint": which,
            "epoch": str(epoch),
            "params_sha256": digest,
        }
        tick = self._mask_ticker(rd.run_id, which)
        if sub.tokens:
            self._lm_checkpoint(model, data, record, which, epoch, digest, tick)
            return
        loss = LabelLoss.of(rd.config.loss)  # the run's [loss]: the damage is measured in it
        rec = audit_checkpoint(
            model,
            data,
            self.settings,
            arrays,
            meta,
            tick,
            loss,
            classes=sub.classes,
            dataset=rd.config.data.dataset,
        )
        rec.update(
            checkpoint=which,
            epoch=epoch,
            params_sha256=digest,
            arrays=str(arrays.relative_to(self.out)),
        )
        full_row = next(m for m in rec["masks"] if m["mask"] == rec["full_mask"])
        record["flags"][which] = failure_flags(
            status=rd.status,
            test_acc=full_row["test"]["acc"],
            train_ce=None,
            classes=sub.classes,
            n_eval=rd.record.data.sizes.test,
        )
        record["checkpoints"][which] = rec
        self._time_once(model, data, rd.run_id, which, digest)
        self._count(True)

    def _lm_checkpoint(
        self,
        model: torch.nn.Module,
        data: Any,
        record: dict[str, Any],
        which: str,
        epoch: int | None,
        digest: str,
        tick: Callable[[int, int], None] | None,
    ) -> None:
        """A language model's checkpoint (:mod:`fathom.audit.lm`): per-token damage, FLOPs,
        the greedy path and the sentences; no class resilience, router or timing."""
        from fathom.audit.lm import lm_audit_checkpoint

        if self.settings.sample_masks is not None:
            raise FathomError(
                "--sample-masks draws random masks of a classifier's audit; a language model's "
                "audit evaluates every mask within --max-masks, else every single and pair "
                "removal and the greedy removal path: drop --sample-masks"
            )
        rec = lm_audit_checkpoint(
            model, data, self.settings.token_max_masks, self.settings.eval_batch_size, tick
        )
        rec.update(checkpoint=which, epoch=epoch, params_sha256=digest)
        record["flags"][which] = []
        record["checkpoints"][which] = rec
        self._count(True)

    def _time_once(
        self, model: torch.nn.Module, data: Any, run_id: str, which: str, digest: str
    ) -> None:
        """Reduced-network timings, once per architecture (the first checkpoint audited)."""
        arch = _architecture(model)
        if arch in self._timed:
            return
        self._timed.add(arch)
        if self.tally is not None:
            self.tally.phase("timing", f" of {arch}")
        else:
            self.say(f"timing reduced networks of {arch}")
        self.speed.append(
            {
                "architecture": arch,
                "run_id": run_id,
                "checkpoint": which,
                "params_sha256": digest,
                "dtype": "float32",
                "timings": _measure_speed(model, data.test_x, self.settings),
            }
        )
