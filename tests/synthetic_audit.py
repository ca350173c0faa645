"""A synthetic study's summary.json and audit (audit.json + per-example ``.npz``), for tests.

The summary is the real :func:`fathom.stats.summarise_study` over the synthetic runs'
records (built by :func:`fathom.study.records.run_record`); the audit is the real
:func:`fathom.audit.checkpoint.audit_checkpoint` and :func:`fathom.audit.aggregate.aggregate`
on tiny randomly initialised residual MLPs and random inputs (router off), so both have
exactly the shapes the report reads from a real study.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from fathom.base.io import atomic_write_json
from fathom.rundir import RunDir

IN_FEATURES = 12
WIDTHS = (10, 8, 8, 6)  # hidden widths: stem + three removable body branches
SCALE_DOWN = ["synthetic data: random values, no training"]


def write_summary(root: Path, reference: str) -> dict[str, Any]:
    """``root/summary.json`` as the study runner writes it, over every run under ``root``."""
    from fathom.rundir import find_runs
    from fathom.stats import summarise_study
    from fathom.study.records import run_record

    records = []
    for rd in find_runs(root):
        c = rd.manifest["config"]
        records.append(run_record(rd, c["model"]["recipe"], c["seed"], c["optim"]["lr"]))
    summary = {
        "study": root.name,
        "description": "synthetic study for report tests",
        "scale_down": list(SCALE_DOWN),
        "devices": ["cpu"],
        "tuning": {"enabled": False},
        "stats": summarise_study(records, reference=reference, target_val_acc=0.5),
    }
    atomic_write_json(root / "summary.json", summary)
    return summary


def _model(recipe: str, seed: int | None, classes: int) -> Any:
    """One base network (torch seed 0); a run's seed perturbs every parameter a little."""
    from fathom.models.ciresan import CiresanMLP

    torch.manual_seed(0)
    m = CiresanMLP(
        widths=WIDTHS, classes=classes, recipe=recipe, in_features=IN_FEATURES, input_scale=1.0
    ).eval()
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.3 * p.abs().mean() * torch.randn(p.shape, generator=g))
    return m


def _data(examples: int, classes: int) -> SimpleNamespace:
    """Random inputs labelled by the base network, 15% of the labels redrawn."""
    gen = torch.Generator().manual_seed(0)
    base = _model("residual", None, classes)

    def labelled(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, IN_FEATURES, generator=gen)
        with torch.no_grad():
            y = base(x).argmax(dim=1)
        flip = torch.rand(n, generator=gen) < 0.15
        y[flip] = torch.randint(0, classes, (int(flip.sum()),), generator=gen)
        return x, y

    (vx, vy), (tx, ty) = labelled(examples), labelled(examples)
    return SimpleNamespace(val_x=vx, val_y=vy, test_x=tx, test_y=ty)


def _audit_run(
    root: Path, run_id: str, i: int, data: Any, settings: Any, classes: int
) -> dict[str, Any]:
    """The audit record of one run: every checkpoint of a perturbed base network."""
    from fathom.audit.checkpoint import audit_checkpoint

    out = root / "audit"
    rd = RunDir(root / run_id)
    recipe = rd.manifest["config"]["model"]["recipe"]
    run_rec: dict[str, Any] = {
        "run_id": run_id,
        "path": run_id,
        "arm": recipe,
        "recipe": recipe,
        "seed": rd.manifest["config"]["seed"],
        "status": "complete",
        "checkpoints": {},
        "flags": {},
    }
    for j, which in enumerate(settings.checkpoints):
        model = _model(recipe, 100 * i + j + 1, classes)
        arrays = out / run_id / f"{which}.npz"
        arrays.parent.mkdir(parents=True, exist_ok=True)
        meta = {"run_id": run_id, "checkpoint": which, "epoch": str(j), "params_sha256": "x"}
        rec = audit_checkpoint(model, data, settings, arrays, meta, classes=classes)
        rec.update(
            checkpoint=which,
            epoch=j,
            params_sha256=f"synthetic-{i}-{j}",
            arrays=str(arrays.relative_to(out)),
        )
        run_rec["checkpoints"][which] = rec
        run_rec["flags"][which] = []
    return run_rec


def write_audit(
    root: Path, run_ids: list[str], *, examples: int = 400, classes: int = 3
) -> dict[str, Any]:
    """``root/audit/audit.json`` and ``.npz`` for the named runs (selected and final)."""
    from fathom.audit.aggregate import aggregate
    from fathom.audit.checkpoint import AuditSettings

    settings = AuditSettings(
        checkpoints=("selected", "final"),
        router=False,
        eval_batch_size=256,
        contrast_a=0,
        contrast_b=(1, 2),
        margin_bins=2,
    )
    data = _data(examples, classes)
    records = [_audit_run(root, r, i, data, settings, classes) for i, r in enumerate(run_ids)]
    result = {
        "format": 1,
        "kind": "study",
        "target": str(root),
        "settings": settings.to_dict(),
        "environment": {},
        "runs": records,
        "skipped": [],
        "speed": [],
        "aggregate": aggregate(records, settings.checkpoints),
        "wall_s": 0.0,
    }
    atomic_write_json(root / "audit" / "audit.json", result)
    return result
