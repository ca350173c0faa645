"""Synthetic study directories that follow the run-directory contract (docs/architecture.md).

For tests and benchmarks of reports and exports before (or without) real studies: each
run is written through :class:`fathom.rundir.RunWriter` (:func:`write_run`), a manifest and
a history with the trainer's fields, per-class scores and
telemetry fields named as in the telemetry registry, with values from a seeded
generator. ``awkward=True`` adds the cases exports must survive: null, NaN, +-inf,
float64 values that float32 cannot hold, a missing epoch and a truncated last line.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fathom.io import atomic_write_json, config_digest
from fathom.rundir import seal

TELEMETRY_PATTERNS = (
    "probe/act/mean/{input}",
    "probe/act/std/{input}",
    "probe/act/zero_frac/{input}",
    "probe/act/q50/{input}",
    "probe/delta/rms/{layer}",
    "probe/delta/absmax/{layer}",
    "param/weight_norm/{layer}",
    "param/disp/{layer}",
    "param/update_ratio/{layer}",
    "grad/mean/weight_norm/{layer}",
    "grad/pex/diversity/{layer}",
    "grad/pex/noise_scale/{layer}",
)


def layer_names(layers: int, plain: bool = False) -> list[str]:
    """The Ciresan MLP's qualified layer names: ``stem``, ``blocks.{i}.res.branch``, ``head``
    (``plain``: a plain recipe's ``blocks.{i}.res``, as the seam names them)."""
    block = "blocks.{}.res" if plain else "blocks.{}.res.branch"
    return ["stem", *(block.format(i) for i in range(layers - 2)), "head"]


def telemetry_names(
    layers: int, patterns: Sequence[str] = TELEMETRY_PATTERNS, plain: bool = False
) -> list[str]:
    """Concrete names; ``{input}`` runs over every layer but the stem (its input is data)."""
    names = []
    every = layer_names(layers, plain)
    for p in patterns:
        if "{input}" in p:
            names += [p.replace("{input}", n) for n in every[1:]]
        else:
            names += [p.replace("{layer}", n) for n in every]
    return names


def synthetic_history(
    seed: int,
    epochs: Sequence[int],
    layers: int = 6,
    classes: int = 10,
    telemetry: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Rows with clocks, split scores, per-class accuracy, confusion and telemetry fields
    (``telemetry``: their names, default :func:`telemetry_names` of ``layers``)."""
    rng = random.Random(seed)
    rows = []
    train_s = elapsed_s = 0.0
    tel = telemetry_names(layers) if telemetry is None else telemetry
    for e in epochs:
        train_s += 0.0 if e == 0 else rng.uniform(0.8, 1.2)
        elapsed_s = train_s * 1.3 + 2.0
        progress = 1.0 - math.exp(-0.3 * e)
        row: dict[str, Any] = {
            "epoch": e,
            "step": e * 100,
            "train/loss_running": None if e == 0 else 2.3 * (1 - progress) + rng.uniform(0, 0.05),
            "clock/training_s": train_s,
            "clock/evaluation_s": 0.1 * e,
            "clock/telemetry_s": 0.05 * e,
            "clock/elapsed_s": elapsed_s,
            "clock/unix_s": 1.7e9 + 1000.0 * seed + elapsed_s,  # the row's own timestamp
        }
        for split in ("fit", "val", "test"):
            row[f"{split}/acc"] = 0.1 + 0.85 * progress + rng.uniform(-0.01, 0.01)
            row[f"{split}/ce"] = 2.3 * (1 - progress) + 0.05 + rng.uniform(0, 0.02)
            for c in range(classes):
                row[f"split/{split}/class_acc/{c}"] = min(
                    1.0, 0.1 + 0.8 * progress + rng.uniform(0, 0.1)
                )
                row[f"split/{split}/class_count/{c}"] = 100 + c
            row[f"split/{split}/confusion"] = [
                [rng.randrange(0, 5) for _ in range(classes)] for _ in range(classes)
            ]
        for name in tel:
            row[name] = rng.lognormvariate(0, 1)
        rows.append(row)
    return rows


SYNTHETIC_SIZES = {"fit": 50_000, "val": 10_000, "test": 10_000}
"""The split sizes a synthetic history's accuracies stand for (MNIST's), so that the
statistics can judge them against chance (``fathom.stats.chance``)."""

LEGACY_FORMAT = 2
"""The manifest format :func:`write_legacy_run` writes: read by its header alone, as every
manifest before format 3 (``fathom.rundir.header.TYPED_FROM``)."""


def _config(name: str, study: str, recipe: str, seed: int, lr: float, rows: list) -> dict:
    return {
        "name": name,
        "study": study,
        "seed": seed,
        "device": "cpu",
        "model": {"kind": "ciresan", "recipe": recipe, "widths": [16, 12, 8]},
        "optim": {"lr": lr, "epochs": max((r["epoch"] for r in rows), default=0)},
    }


def _sections(path: Path, study: str, rows: list, phase: str | None) -> dict:
    """The manifest sections a synthetic run shares in every format (config excluded)."""
    last = rows[-1] if rows else {}
    val_ce = [(r["val/ce"], r["epoch"]) for r in rows if _finite(r.get("val/ce"))]
    return {
        "kind": "run",
        "phase": phase,
        "run_id": path.name,
        "study": study,
        "status_reason": None,
        "source_hash": "synthetic",
        "clocks": {
            "training_s": last.get("clock/training_s"),
            "elapsed_s": last.get("clock/elapsed_s"),
        },
        "epochs_completed": last.get("epoch") or 0,
        "selected": {"epoch": min(val_ce)[1] if val_ce else None},
        "final": {"epoch": last.get("epoch")},
    }


def write_run(
    path: Path,
    *,
    study: str,
    recipe: str,
    seed: int,
    lr: float,
    rows: list[dict[str, Any]],
    phase: str | None = None,
    layers: Sequence[str] | None = None,
    status: str = "complete",
) -> Path:
    """A run directory written through :class:`fathom.rundir.RunWriter` (format 3, typed):
    the manifest's sections are a sketch of a real run's (no weights files, synthetic hashes
    and environment), ``rows`` its history. ``layers`` (model order) become the manifest's
    ``telemetry.layers`` list, as the seam writes it (without it the manifest lists none,
    like a run with telemetry off). A run already at ``path`` is replaced."""
    from fathom.rundir import RunManifest, RunWriter
    from fathom.rundir.header import FORMAT

    config = _config(path.name, study, recipe, seed, lr, rows)
    sections = _sections(path, study, rows, phase)
    telemetry: dict[str, Any] = {"enabled": layers is not None}
    if layers is not None:
        telemetry["layers"] = [
            {"name": n, "type": "Linear", "kind": "linear", "params": {}} for n in layers
        ]
    manifest = RunManifest.model_validate(
        {
            **sections,
            "format": FORMAT,
            "status": "running",
            "config": config,
            "config_hash": config_digest(config),
            "data": {
                "dataset": "synthetic",
                "files": {},
                "split_mode": None,
                "split_seed": None,
                "split_hash": "synthetic",
                "tensors_sha256": "synthetic",
                "sizes": dict(SYNTHETIC_SIZES),
                "info": {},
            },
            "model": {"kind": "ciresan", "class": "CiresanMLP", "parameters": 0},
            "hashes": {
                "initial_params": f"init-{seed}",
                "final_params": f"final-{seed}",
                "training_order": "synthetic",
                "masks": "synthetic",
            },
            "environment": _ENVIRONMENT,
            "telemetry": telemetry,
            "execution": {"path": "eager", "precision": "fp32"},
        }
    )
    if (path / "manifest.json").exists():  # a test rewriting a run replaces it
        shutil.rmtree(path)
    writer = RunWriter(path).acquire()
    try:
        writer.start(manifest)
        for row in rows:
            writer.row(row)
        writer.finish(status)
    finally:
        writer.close()
    return path


_ENVIRONMENT = {
    "python": "synthetic",
    "torch": "synthetic",
    "numpy": "synthetic",
    "platform": "synthetic",
    "machine": "synthetic",
    "cpu_count": None,
    "threads": 1,
    "device": "cpu",
    "device_name": "cpu",
    "dtype": "float32",
    "matmul_precision": "highest",
    "cuda": None,
    "cpu_allocator_tuned": False,
}


def write_legacy_run(
    path: Path,
    *,
    study: str,
    recipe: str,
    seed: int,
    lr: float,
    rows: list[dict[str, Any]],
    truncated_tail: bool = False,
    phase: str | None = None,
    status: str = "complete",
) -> Path:
    """A run directory as no current writer makes it, on purpose: a format-2 manifest (read
    by its header alone, as an older fathom wrote it) and ``history.jsonl`` dumped with
    Python's ``json`` (``NaN`` and ``Infinity`` literals kept, which :class:`RunWriter`
    writes as ``null``); ``truncated_tail`` appends a torn line after the rows the
    manifest's digest covers. For the tests of old-format reading and damaged histories."""
    path.mkdir(parents=True, exist_ok=True)
    config = _config(path.name, study, recipe, seed, lr, rows)
    sections = _sections(path, study, rows, phase)
    manifest: dict[str, Any] = {
        **sections,
        "format": LEGACY_FORMAT,
        "status": status,
        "config": config,
        "config_hash": config_digest(config),
        "data": {
            "dataset": "synthetic",
            "files": {},
            "split_hash": "synthetic",
            "sizes": dict(SYNTHETIC_SIZES),
        },
        "hashes": {"initial_params": f"init-{seed}", "final_params": f"final-{seed}"},
        "environment": {"python": "synthetic", "device": "cpu"},
    }
    text = "".join(json.dumps(r) + "\n" for r in rows)
    digest = hashlib.sha256(text.encode()).hexdigest()
    history = {"bytes": len(text.encode()), "rows": len(rows), "sha256": digest}
    manifest["integrity"] = {"history": history}
    atomic_write_json(path / "manifest.json", seal(manifest))
    if truncated_tail:
        text += '{"epoch": 99, "val/acc": 0.5'
    (path / "history.jsonl").write_text(text)
    return path


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def awkward_rows(seed: int) -> list[dict[str, Any]]:
    """Rows with null, NaN, +-inf, float64-only values and epoch 2 missing."""
    rows = synthetic_history(seed, [0, 1, 3, 4], layers=3, classes=3)
    rows[1]["val/ce"] = math.nan
    rows[1]["probe/act/mean/blocks.0.res.branch"] = math.inf
    rows[2]["probe/act/mean/blocks.0.res.branch"] = -math.inf
    rows[2]["val/acc"] = None
    rows[3]["fit/ce"] = 0.1 + 1e-12  # distinct from its float32 rounding
    rows[3]["param/disp/stem"] = 1e300  # beyond float32 range
    rows[3]["diverged"] = False  # a boolean field, as the trainer writes for a diverged epoch
    rows[3]["note"] = "text"  # not a number: JSONL keeps it, W&B and TensorBoard leave it out
    for row in rows:  # a history written before the rows carried their own timestamp
        del row["clock/unix_s"]
    return rows


def write_study(
    root: str | Path,
    *,
    recipes: Sequence[str] = ("residual", "sd_constant"),
    seeds: Sequence[int] = (101, 102),
    epochs: Sequence[int] = (0, 1, 2, 3, 4),
    layers: int = 6,
    classes: int = 10,
    lr: float = 0.01,
    awkward: bool = False,
    telemetry: Sequence[str] | None = None,
    layer_lists: bool = False,
) -> list[Path]:
    """A study directory of ``len(recipes) * len(seeds)`` runs (plus one awkward run).

    ``layer_lists``: every manifest lists its layers (``telemetry.layers``, as the seam
    writes them) and a recipe named ``plain`` records the plain layer names
    (``blocks.{i}.res``), as a real study of plain and residual recipes does."""
    root = Path(root)
    out = []
    for i, recipe in enumerate(recipes):
        plain = layer_lists and recipe == "plain"
        tel = telemetry_names(layers, plain=True) if plain and telemetry is None else telemetry
        for seed in seeds:
            rows = synthetic_history(seed * 31 + i, epochs, layers, classes, tel)
            out.append(
                write_run(
                    root / f"{recipe}-s{seed}",
                    study=root.name,
                    recipe=recipe,
                    seed=seed,
                    lr=lr,
                    rows=rows,
                    layers=layer_names(layers, plain) if layer_lists else None,
                )
            )
    if awkward:
        out.append(
            write_legacy_run(
                root / "awkward-s7",
                study=root.name,
                recipe="plain",
                seed=7,
                lr=0.03,
                rows=awkward_rows(7),
                truncated_tail=True,
            )
        )
    return out
