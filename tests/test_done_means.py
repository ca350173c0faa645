"""The "done means" checks, end to end through the CLI at tiny sizes: ``fathom train`` runs a
depth-scaling config (staged conv net, residual control, Lyapunov arm) and a user's
``python``-kind residual CNN on a user's ``.npz``; ``fathom audit``, ``fathom curvature``,
``fathom report`` and ``fathom export`` accept both run directories; every key of every
history row (these runs and a ``fathom depth-scaling`` run) is declared in the registry."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from done_means_models import write_images_npz, write_toml
from fathom.cli import main
from fathom.depthscale.config import make_config, plan_runs
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.telemetry.registry import field_for

torch.set_num_threads(1)


def _depth_config(tmp: Path, depth: int = 8) -> Path:
    """The Lyapunov arm of a residual ANN depth-scaling run (depth 8: 4 skippable branches)."""
    cfg = make_config(
        "quick", depths=[depth], timesteps=0, residual=True, epochs=1, fit_subset=64, eval_subset=32
    )
    lyap = next(c for c in plan_runs(cfg, "done") if c.tags["arm"] == "Lyapunov")
    return write_toml(tmp / "depth.toml", lyap.model_dump(mode="json"))


def _user_config(tmp: Path) -> Path:
    npz = write_images_npz(tmp / "bands.npz")
    data = {
        "name": "user-cnn",
        "study": "done",
        "seed": 1,
        "device": "cpu",
        "data": {"dataset": "tensors", "path": str(npz)},
        "model": {
            "kind": "python",
            "factory": "done_means_models:residual_cnn",
            "kwargs": {"channels": 4, "blocks": 2, "classes": 3},
        },
        "optim": {"name": "adamw", "lr": 0.01, "batch_size": 32, "epochs": 2},
        "eval": {"every": 1},
        "checkpoints": {"save_epochs": [0, 2]},
    }
    return write_toml(tmp / "user.toml", data)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("fathom.data")
    tmp = tmp_path_factory.mktemp("done")
    root = tmp / "runs"
    sys.path.insert(0, str(Path(__file__).parent))  # the factory's module, as a user's would be
    for path in (_depth_config(tmp), _user_config(tmp)):
        assert main(["train", str(path), "--runs-dir", str(root), "--quiet"]) == 0
    out = {"depth": root / "done" / "d08-lyapunov-s0", "user": root / "done" / "user-cnn"}
    for p in out.values():
        assert RunDir(p).manifest["status"] == "complete"
    return out


@pytest.mark.parametrize("which", ["depth", "user"])
def test_train_wrote_a_complete_run_of_its_kind(runs, which):
    m = RunDir(runs[which]).manifest
    assert m["model"]["kind"] == {"depth": "staged_conv", "user": "python"}[which]
    assert RunDir(runs[which]).config.model.kind == m["model"]["kind"]
    assert m["config"]["kind"] == "run"


@pytest.mark.parametrize("which", ["depth", "user"])
def test_audit_accepts_the_run(runs, which, tmp_path):
    out = tmp_path / "audit"
    argv = ["audit", str(runs[which]), "--out", str(out), "--checkpoint", "final", "--quiet"]
    argv += ["--no-router", "--timing-repeats", "1"]
    if which == "user":
        argv += ["--contrast", "0:1,2"]
    assert main(argv) == 0
    text = (out / "audit.json").read_text()
    assert '"n_masks"' in text  # the masks were evaluated
    if which == "depth":  # one epoch on 64 images: no full-correct contrast example to bin
        assert "cannot fill 5 margin bins; standardized contrasts are null" in text


@pytest.mark.parametrize("which", ["depth", "user"])
def test_curvature_accepts_the_run(runs, which, tmp_path, capsys):
    out = tmp_path / "curv"
    argv = ["curvature", str(runs[which]), "--probe", "8", "--epochs", "0", "--out", str(out)]
    assert main(argv) == 0
    assert "GGN tr" in capsys.readouterr().out
    assert any(out.iterdir())


@pytest.mark.parametrize("which", ["depth", "user"])
def test_report_and_export_accept_the_run(runs, which, tmp_path):
    assert main(["report", str(runs[which]), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.html").exists()
    assert main(["export", str(runs[which]), "--to", "jsonl", "--out", str(tmp_path / "ex")]) == 0
    assert any((tmp_path / "ex").rglob("*.jsonl"))


def _undeclared(run: Path) -> set[str]:
    keys = {k for row in RunDir(run).history() for k in row}
    bad = set()
    for k in keys:
        try:
            field_for(k)
        except FathomError:
            bad.add(k)
    return bad


def test_every_history_key_of_a_trained_run_is_declared_once(runs):
    for run in runs.values():
        assert _undeclared(run) == set()


def test_every_history_key_of_a_depth_scaling_run_is_declared_once(tmp_path, capsys):
    """... and the audit of its plain (branchless) run is refused with the reason."""
    pytest.importorskip("fathom.data")
    out = tmp_path / "ds"
    argv = ["depth-scaling", "--preset", "quick", "--depths", "4", "--epochs", "1"]
    argv += ["--timesteps", "0", "--fit-subset", "32", "--eval-subset", "16"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    dirs = sorted(p for p in out.iterdir() if p.is_dir())
    assert [p.name for p in dirs] == ["d04-lyapunov-s0", "d04-vanilla-s0"]
    for run in dirs:
        assert _undeclared(run) == set()
    assert json.loads((out / "table.json").read_text())
    assert main(["audit", str(dirs[1]), "--out", str(tmp_path / "a"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "has no removable branches" in err and "d04-vanilla-s0" in err


def test_an_undeclared_key_is_caught():
    with pytest.raises(FathomError, match="matches 0 registry entries"):
        field_for("train/made_up")
