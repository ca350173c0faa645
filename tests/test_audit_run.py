"""Audit of run directories: tiny trained runs on synthetic digits, one run and a study."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fathom.audit.checkpoint import AuditSettings
from fathom.audit.evaluate import load_scores
from fathom.audit.run import audit_runs
from fathom.config import RunConfig
from fathom.data import DataSplits
from fathom.errors import FathomError
from fathom.train.loop import train

pytestmark = pytest.mark.usefixtures("needs_sklearn")
torch.set_num_threads(1)


def synthetic_splits(n_fit=400, n_eval=300, seed=0) -> DataSplits:
    """28x28 uint8 'digits': class c lights a 4x4 block at grid cell c, plus noise."""
    g = torch.Generator().manual_seed(seed)

    def make(n):
        y = torch.randint(0, 10, (n,), generator=g)
        x = torch.randint(0, 60, (n, 28, 28), generator=g, dtype=torch.uint8)
        for i, c in enumerate(y.tolist()):
            r, col = divmod(c, 5)
            x[i, 4 + 8 * r : 8 + 8 * r, 2 + 5 * col : 6 + 5 * col] = 250
        return x, y

    fx, fy = make(n_fit)
    vx, vy = make(n_eval)
    tx, ty = make(n_eval)
    return DataSplits(fx, fy, vx, vy, tx, ty, split_hash=f"synthetic-{seed}", info={"classes": 10})


def config(recipe: str, seed: int) -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": f"{recipe}-{seed}",
            "study": "tiny",
            "seed": seed,
            "device": "cpu",
            "model": {"recipe": recipe, "widths": [32, 24, 16, 12, 8]},
            "optim": {"epochs": 3, "batch_size": 32, "lr": 0.05},
            "eval": {"every": 1, "first": [1]},
            "checkpoints": {"save_epochs": [0, 3]},
        }
    )


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    splits = synthetic_splits()
    for recipe in ("residual", "sd_constant"):
        for seed in (1, 2):
            train(config(recipe, seed), root / f"{recipe}-{seed}", splits=splits)
    train(config("plain", 1), root / "plain-1", splits=splits)
    # a study's tuning-grid run (another learning rate): never an arm of the comparison
    train(
        config("residual", 9).with_updates({"optim.lr": 0.2}),
        root / "tune-residual-lr0.2-s9",
        splits=splits,
        phase="tuning",
    )
    return root, splits


SETTINGS = AuditSettings(
    checkpoints=("selected", "final"),
    min_samples_leaf=20,
    n_permutations=50,
    margin_bins=3,
    timing_batch_sizes=(8,),
    timing_repeats=1,
    routed_timing_examples=64,
    routed_timing_repeats=1,
)


def test_study_audit_writes_traceable_outputs(study, tmp_path):
    root, splits = study
    said: list[str] = []
    result = audit_runs(root, SETTINGS, tmp_path / "out", splits=splits, progress=said.append)
    assert result["kind"] == "study"
    # progress: k/N checkpoints after each one audited (5 removable-or-not runs x 2; plain-1's
    # two are counted as skipped, without a line)
    tally = [line for line in said if "checkpoints  elapsed" in line]
    done = [int(line.split("/")[0]) for line in tally]
    assert len(tally) == 8 and done == sorted(done) and all("/10 " in t for t in tally)
    assert {r["run_id"] for r in result["runs"]} == {
        "residual-1",
        "residual-2",
        "sd_constant-1",
        "sd_constant-2",
    }
    skipped = {s["run_id"]: s["reason"] for s in result["skipped"]}
    assert skipped.keys() == {"plain-1", "tune-residual-lr0.2-s9"}
    assert "no removable branches" in skipped["plain-1"]
    assert "tuning-phase" in skipped["tune-residual-lr0.2-s9"]
    on_disk = json.loads((tmp_path / "out" / "audit.json").read_text())
    assert on_disk["aggregate"].keys() == {"selected", "final"}
    md = (tmp_path / "out" / "audit.md").read_text()
    run = next(r for r in result["runs"] if r["run_id"] == "sd_constant-1")
    rec = run["checkpoints"]["final"]
    assert rec["params_sha256"] in md and rec["epoch"] == 3
    assert len(rec["masks"]) == 16 and rec["k"] == 4
    full = next(m for m in rec["masks"] if m["mask"] == "1111")
    assert full["test"]["damage"] == 0.0 and full["macs_fraction"] == 1.0
    assert rec["by_size"]["2"]["n_masks"] == 6
    # Per-example arrays reproduce the table without the model.
    scores, meta = load_scores(str(tmp_path / "out" / rec["arrays"]))
    assert meta["params_sha256"] == rec["params_sha256"]
    idx = [m["mask"] for m in rec["masks"]].index("0101")
    assert scores["test"].accuracy()[idx] == pytest.approx(rec["masks"][idx]["test"]["acc"])
    assert scores["test"].damage()[idx] == pytest.approx(
        rec["masks"][idx]["test"]["damage"], abs=1e-6
    )
    # Aggregates are traceable to their inputs and compare recipes paired by seed.
    agg = result["aggregate"]["final"]
    arm = agg["arms"]["sd_constant"]
    assert {i["params_sha256"] for i in arm["inputs"]} == {
        r["checkpoints"]["final"]["params_sha256"]
        for r in result["runs"]
        if r["recipe"] == "sd_constant"
    }
    assert arm["by_size"]["2"]["test_damage"]["n"] == 2
    assert agg["reference_arm"] == "residual"
    kept = {p["kept"] for p in agg["paired_damage"]}
    assert kept == {"0", "1", "2", "3"}
    assert all("sd_constant vs residual" in p["sentence"] for p in agg["paired_damage"])
    assert arm["routing"]["runs"] == 2 and "router vs" in arm["routing"]["sentence"]
    assert result["speed"][0]["timings"][0]["batch_size"] == 8
    assert len(result["speed"][0]["timings"][0]["speedup_vs_dense"]) == 16


def test_single_run_and_bad_inputs(study, tmp_path):
    root, splits = study
    settings = AuditSettings(router=False, margin_bins=3, timing_batch_sizes=(4,), timing_repeats=1)
    result = audit_runs(root / "sd_constant-1", settings, tmp_path / "one", splits=splits)
    assert result["kind"] == "run" and len(result["runs"]) == 1
    assert result["runs"][0]["checkpoints"]["selected"]["routing"] is None
    inter = result["runs"][0]["checkpoints"]["selected"]["interactions"]["test"]
    assert inter["defined"] and 0.0 <= inter["mean_fraction"] <= 1.0
    with pytest.raises(FathomError, match="no removable branches"):
        audit_runs(root / "plain-1", settings, tmp_path / "p", splits=splits)
    with pytest.raises(FathomError, match="no run directories"):
        audit_runs(tmp_path / "one", settings, splits=splits)
    with pytest.raises(FathomError, match="no checkpoint for epoch"):
        audit_runs(
            root / "residual-1",
            AuditSettings(checkpoints=("2",), router=False, margin_bins=3),
            tmp_path / "m",
            splits=splits,
        )
    sampled = AuditSettings(
        sample_masks=8, router=False, margin_bins=3, timing_batch_sizes=(4,), timing_repeats=1
    )
    res = audit_runs(root / "residual-1", sampled, tmp_path / "s", splits=splits)
    rec = res["runs"][0]["checkpoints"]["selected"]
    assert len(rec["masks"]) == 8 and not rec["enumerated"]
    assert rec["interactions"]["test"]["defined"] is False
    assert np.isfinite(rec["by_size"]["3"]["test"]["damage"])


def test_run_without_validation_is_refused(study, tmp_path):
    root, splits = study
    empty = DataSplits(
        splits.fit_x,
        splits.fit_y,
        splits.val_x[:0],
        splits.val_y[:0],
        splits.test_x,
        splits.test_y,
        split_hash="no-val",
        info={"classes": 10},
    )
    with pytest.raises(FathomError, match="fit-val"):
        audit_runs(root / "residual-1", AuditSettings(router=False), tmp_path / "o", splits=empty)


def test_mask_progress_counts_every_pass_with_an_eta(study, tmp_path, monkeypatch):
    """``mask_progress`` (a terminal's) gets k/N mask passes (N = 2 x 16 masks: validation,
    then test) with the whole audit's ETA, then what the checkpoint does after them, before the checkpoint's own tally line; without it,
    ``progress`` gets no per-mask line. The 2 s throttle is lifted here to see every line."""
    import dataclasses

    import fathom.audit.run as audit_run
    from fathom.base.terminal import Throttle

    root, splits = study
    monkeypatch.setattr(audit_run, "Throttle", lambda say: Throttle(say, every_s=0.0))
    settings = dataclasses.replace(SETTINGS, checkpoints=("final",), router=False)
    said: list[str] = []
    masks: list[str] = []
    run = root / "sd_constant-1"
    audit_runs(run, settings, tmp_path / "a", splits=splits, progress=said.append,
               mask_progress=masks.append)  # fmt: skip
    passes, after = masks[:-1], masks[-1]
    assert [int(m.split(": ")[1].split("/")[0]) for m in passes] == list(range(1, 32))
    assert all("/32 mask passes (val + test)  audit ETA " in m for m in passes)
    # after the last pass the line says what runs then, not a frozen ETA 0:00
    assert "tables, interactions, resilience, router" in after and "audit ETA " in after
    assert all(m.startswith("    sd_constant-1 final: ") for m in masks)
    assert not any("mask passes" in line for line in said)
    assert any("1/1 checkpoints" in line for line in said)
    said.clear()
    audit_runs(run, settings, tmp_path / "b", splits=splits, progress=said.append)
    assert said and not any("mask passes" in line for line in said)
