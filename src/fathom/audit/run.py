"""Audit run directories: one run, or every run of a study (found by its manifest.json).

Outputs, under ``out_dir`` (default ``<target>/audit``):

* ``audit.json``: settings, every run's per-checkpoint tables (with run id, epoch and the
  checkpoint's ``params_sha256``), reduced-network timings, and the across-seed aggregate;
* ``audit.md``: the same numbers as tables and computed sentences;
* ``<run-id>/<checkpoint>.npz``: per-example logits, correctness and margins per mask.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fathom.audit.aggregate import aggregate
from fathom.audit.checkpoint import AuditSettings, audit_checkpoint, choose_masks
from fathom.audit.masks import full_mask_index, mask_label, removable_branch_count
from fathom.audit.report import to_markdown
from fathom.audit.router import require_sklearn
from fathom.audit.speed import time_masks
from fathom.audit.subjects import Subject, subject_of
from fathom.errors import FathomError
from fathom.io import atomic_write_json, atomic_write_text, config_digest, ensure_writable_dir
from fathom.rundir import find_runs
from fathom.stats import failure_flags

FORMAT = 1
Progress = Callable[[str], None]


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


def measure_speed(
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
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Audit ``target`` (a run or a study directory); write and return ``audit.json``'s dict.

    ``splits`` overrides the data a run would re-derive from its config (tests, synthetic
    data); otherwise each distinct recorded split hash is loaded once and verified.
    """
    t0 = time.perf_counter()
    target = Path(target)
    if not target.exists():
        raise FathomError(f"{str(target)!r} does not exist; pass a run or study directory")
    single = (target / "manifest.json").exists()
    runs = find_runs(target)
    if not runs:
        raise FathomError(
            f"no run directories (manifest.json + history.jsonl) under {str(target)!r}; pass a run "
            "directory or a study directory that holds runs"
        )
    if settings.router:
        require_sklearn()
    out = ensure_writable_dir(Path(out_dir) if out_dir is not None else target / "audit")
    device = _resolve_device(settings.device)
    say = progress or (lambda _msg: None)
    skipped: list[dict[str, str]] = []
    if not single:  # a study's tuning grid selects learning rates; it is not an arm
        skipped += [
            {"run_id": rd.run_id, "reason": "tuning-phase run (learning-rate selection)"}
            for rd in runs
            if rd.phase == "tuning"
        ]
        runs = [rd for rd in runs if rd.phase != "tuning"]
    subjects = [subject_of(rd) for rd in runs]
    arms = _arm_names(subjects)
    split_cache: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    speed: list[dict[str, Any]] = []
    timed_architectures: set[str] = set()
    for sub in subjects:
        rd, recipe = sub.rd, sub.family
        if single and rd.status != "complete" and "final" in settings.checkpoints:
            epochs = (rd.manifest["config"].get("optim") or {}).get("epochs", "?")
            raise FathomError(
                f"run {rd.run_id!r} is incomplete (status {rd.status!r}, "
                f"{rd.manifest.get('epochs_completed')} of {epochs} epochs): it has no final "
                f"checkpoint. Resume it first (fathom train --resume {rd.path}) or audit its "
                "selected checkpoint only (--checkpoint selected)"
            )
        if rd.status != "complete" and not single:
            skipped.append({"run_id": rd.run_id, "reason": f"status {rd.status!r}, not complete"})
            continue
        if sub.removable_reason is not None:
            if single:
                raise FathomError(f"run {rd.run_id!r}: {sub.removable_reason}")
            skipped.append({"run_id": rd.run_id, "reason": sub.removable_reason})
            continue
        if splits is not None:
            data = splits
        else:
            key = f"{sub.kind}:{rd.manifest.get('data', {}).get('split_hash')}"
            if key not in split_cache:
                say(f"loading data splits for {rd.run_id}")
                split_cache[key] = sub.load_splits(device)
            data = split_cache[key]
        run_rec: dict[str, Any] = {
            "run_id": rd.run_id,
            "path": str(rd.path.resolve().relative_to(target.resolve())) if not single else ".",
            "arm": arms[rd.run_id],
            "recipe": recipe,
            "seed": sub.seed,
            "status": rd.status,
            "config_hash": rd.manifest.get("config_hash"),
            "split_hash": rd.manifest.get("data", {}).get("split_hash"),
            "checkpoints": {},
            "flags": {},
        }
        for which in settings.checkpoints:
            try:
                model = sub.load_model(which, device)
                digest = rd.checkpoint_hash(which)
                epoch = rd.checkpoint_epoch(which)
            except FathomError as e:
                if single:
                    raise
                run_rec["checkpoints"][which] = {"missing": str(e)}
                continue
            say(f"auditing {rd.run_id} at {which} checkpoint (epoch {epoch})")
            arrays = out / rd.run_id / f"{which}.npz"
            ensure_writable_dir(arrays.parent)
            meta = {
                "run_id": rd.run_id,
                "checkpoint": which,
                "epoch": str(epoch),
                "params_sha256": digest,
            }
            rec = audit_checkpoint(model, data, settings, arrays, meta)
            rec.update(
                checkpoint=which,
                epoch=epoch,
                params_sha256=digest,
                arrays=str(arrays.relative_to(out)),
            )
            full_row = next(m for m in rec["masks"] if m["mask"] == rec["full_mask"])
            run_rec["flags"][which] = failure_flags(
                status=rd.status,
                test_acc=full_row["test"]["acc"],
                train_ce=None,
                classes=sub.classes,
            )
            run_rec["checkpoints"][which] = rec
            arch = _architecture(model)
            if arch not in timed_architectures:
                timed_architectures.add(arch)
                say(f"timing reduced networks of {arch}")
                speed.append(
                    {
                        "architecture": arch,
                        "run_id": rd.run_id,
                        "checkpoint": which,
                        "params_sha256": digest,
                        "dtype": "float32",
                        "timings": measure_speed(model, data.test_x, settings),
                    }
                )
        records.append(run_rec)
    result = {
        "format": FORMAT,
        "kind": "run" if single else "study",
        "target": str(target),
        "settings": settings.to_dict(),
        "environment": {
            "torch": torch.__version__,
            "numpy": np.__version__,
            "device": str(device),
            "threads": torch.get_num_threads(),
        },
        "runs": records,
        "skipped": skipped,
        "speed": speed,
        "aggregate": aggregate(records, settings.checkpoints),
        "wall_s": None,
    }
    result["wall_s"] = time.perf_counter() - t0
    atomic_write_json(out / "audit.json", result)
    atomic_write_text(out / "audit.md", to_markdown(result))
    return result
