"""The trainer: determinism, run directory contract, divergence, exact resume, bad input."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from conftest import tiny_config
from fathom.base.io import read_jsonl, state_dict_digest
from fathom.cli import main
from fathom.errors import FathomError
from fathom.rundir import RunDir, seal
from fathom.train.loop import resume, train


def test_same_config_twice_is_byte_identical(tmp_path, splits):
    cfg = tiny_config(**{"model.recipe": "sd_constant"})
    a = train(cfg, tmp_path / "a", splits=splits)
    b = train(cfg, tmp_path / "b", splits=splits)
    assert a.status == b.status == "complete"
    assert a.final_params == b.final_params
    ma, mb = RunDir(a.run_dir).manifest, RunDir(b.run_dir).manifest
    assert ma["hashes"] == mb["hashes"]
    c = train(
        tiny_config(**{"model.recipe": "sd_constant", "seed": 7}), tmp_path / "c", splits=splits
    )
    assert c.final_params != a.final_params


def test_run_directory_contract(tmp_path, splits):
    cfg = tiny_config(**{"model.recipe": "residual_dropout", "eval.every": 2, "eval.first": [1]})
    res = train(cfg, tmp_path / "r", splits=splits)
    rd = RunDir(res.run_dir)
    m = rd.manifest
    assert m["status"] == "complete" and m["epochs_completed"] == 3
    for key in ("config_hash", "source_hash", "data", "hashes", "environment", "clocks"):
        assert m[key]
    assert set(m["hashes"]) == {"initial_params", "final_params", "training_order", "masks"}
    assert m["clocks"]["training_s"] > 0 and m["clocks"]["elapsed_s"] >= m["clocks"]["training_s"]
    rows = rd.history()
    assert [r["epoch"] for r in rows] == [0, 1, 2, 3]  # 0, first=1, every 2, last
    assert rows[0]["train/loss_running"] is None
    assert all(0 <= r["val/acc"] <= 1 for r in rows)
    assert rows[-1]["clock/training_s"] >= rows[1]["clock/training_s"]
    final = rd.load_state("final")
    assert state_dict_digest(final) == m["hashes"]["final_params"]
    sel_epoch = rd.checkpoint_epoch("selected")
    best = min((r for r in rows if r["epoch"] >= 1), key=lambda r: r["val/ce"])
    assert sel_epoch == best["epoch"]
    assert rd.checkpoint_epochs() == [0, 1, 2, 3]


def test_tampered_checkpoint_is_refused(tiny_run_copy):
    rd = RunDir(tiny_run_copy)
    path = rd.path / "checkpoints" / "epoch-0002.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(FathomError, match="hash check"):
        rd.load_model(2)
    with pytest.raises(FathomError, match=r"saved epochs: \[0, 1, 2, 3\]"):
        rd.load_model(7)


def test_divergence_is_reported_not_raised(tmp_path, splits):
    res = train(tiny_config(**{"optim.lr": 1e6, "optim.epochs": 4}), tmp_path / "d", splits=splits)
    assert res.status == "diverged"
    assert res.diverged_epoch is not None and res.final_params is None
    m = RunDir(res.run_dir).manifest
    assert m["status"] == "diverged" and "non-finite" in m["status_reason"]


def test_interrupted_then_resumed_is_byte_identical(tmp_path, splits):
    cfg = tiny_config(**{"model.recipe": "sd_decreasing", "optim.epochs": 4})
    full = train(cfg, tmp_path / "full", splits=splits)

    def interrupt_after_epoch_2(event, row):
        if row["epoch"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "part", splits=splits, progress=interrupt_after_epoch_2)
    assert RunDir(tmp_path / "part").manifest["status"] == "interrupted"
    resumed = train(cfg, tmp_path / "part", splits=splits, resume=True)
    assert resumed.status == "complete"
    assert resumed.final_params == full.final_params
    assert [r["epoch"] for r in resumed.history] == [0, 1, 2, 3, 4]
    keys = ("fit/acc", "val/ce", "test/acc", "train/loss_running")
    assert [[r[k] for k in keys] for r in resumed.history] == [
        [r[k] for k in keys] for r in full.history
    ]


def _write_cfg(path: Path, epochs: int) -> Path:
    path.write_text(f"""
name = "k"
study = "resume"
seed = 5
device = "cpu"
[data]
fit_subset = 3000
eval_subset = 500
[model]
recipe = "sd_constant"
widths = [64, 48, 32, 24, 16]
[optim]
lr = 0.03
batch_size = 32
epochs = {epochs}
[eval]
every = 1
""")
    return path


def test_resume_after_sigkill_is_byte_identical(tmp_path, forked):
    # the reference and the resume run in this process; the victim is a real process (a
    # fork of this one, :mod:`forked`) killed by SIGKILL at a moment it cannot choose
    cfg_path = _write_cfg(tmp_path / "cfg.toml", epochs=12)
    assert main(["train", str(cfg_path), "--runs-dir", str(tmp_path / "ref"), "--quiet"]) == 0
    ref_hash = RunDir(tmp_path / "ref" / "resume" / "k").manifest["hashes"]["final_params"]

    victim = forked(["train", str(cfg_path), "--runs-dir", str(tmp_path / "v"), "--quiet"])
    hist = tmp_path / "v" / "resume" / "k" / "history.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:
        rows, _ = read_jsonl(hist) if hist.exists() else ([], [])
        if len(rows) >= 3:
            break
        assert victim.poll() is None, victim.output()
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 0.4))  # land somewhere inside a later epoch
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    run_dir = tmp_path / "v" / "resume" / "k"
    assert RunDir(run_dir).manifest["status"] == "running"
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    m = RunDir(run_dir).manifest
    assert m["status"] == "complete"
    assert m["hashes"]["final_params"] == ref_hash
    ref_m = RunDir(tmp_path / "ref" / "resume" / "k").manifest
    assert m["hashes"]["training_order"] == ref_m["hashes"]["training_order"]
    assert m["hashes"]["masks"] == ref_m["hashes"]["masks"]
    rows = RunDir(run_dir).history()
    assert [r["epoch"] for r in rows] == list(range(13))


def test_bad_resumes_are_refused(tiny_run_copy, tmp_path, splits):
    cfg, run_dir = tiny_config(), tiny_run_copy
    with pytest.raises(FathomError, match="already complete"):
        resume(run_dir)
    with pytest.raises(FathomError, match="already holds a run"):
        train(cfg, run_dir, splits=splits)
    with pytest.raises(FathomError, match="not a run directory"):
        resume(tmp_path / "nowhere")
    m = json.loads((run_dir / "manifest.json").read_text())
    m["status"] = "running"
    (run_dir / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FathomError, match="fails its digest check"):
        resume(run_dir)  # a hand-edited manifest is detected
    (run_dir / "manifest.json").write_text(json.dumps(seal(m)))
    with pytest.raises(FathomError, match=r"another config \(optim.lr"):
        train(cfg.with_updates({"optim.lr": 0.5}), run_dir, splits=splits, resume=True)
    (run_dir / "checkpoints" / "resume.safetensors").write_bytes(b"garbage")
    with pytest.raises(FathomError, match="resume state .* is corrupt"):
        resume(run_dir)
    (run_dir / "manifest.json").write_text("{not json")
    with pytest.raises(FathomError, match="corrupt"):
        resume(run_dir)


def test_unwritable_run_directory(tmp_path, splits):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root ignores permission bits: use a path under a file
            target = tmp_path / "afile"
            target.write_text("x")
            bad = target / "run"
        else:
            bad = ro / "run"
        with pytest.raises(FathomError, match="cannot write to directory"):
            train(tiny_config(), bad, splits=splits)
    finally:
        ro.chmod(0o700)


def test_bad_configs_name_the_problem():
    from fathom.config import validate_run_config

    with pytest.raises(FathomError, match="unknown key 'optim.lrr'"):
        validate_run_config({"optim": {"lrr": 0.1}})
    with pytest.raises(FathomError, match="optim.lr: Input should be greater than 0"):
        validate_run_config({"optim": {"lr": 0}})
    with pytest.raises(FathomError, match="optim.batch_size"):
        validate_run_config({"optim": {"batch_size": -4}})
    with pytest.raises(FathomError, match=r"outside \[0, 1\)"):
        validate_run_config({"model": {"drop_probs": [0.1, 0.2, 0.3, 1.0]}})
    with pytest.raises(FathomError, match="non-increasing"):
        validate_run_config({"model": {"widths": [10, 20, 5]}})


def test_cli_shows_live_progress_and_quiet_silences_it(tmp_path, capsys):

    cfg_path = _write_cfg(tmp_path / "cfg.toml", epochs=2)
    assert main(["train", str(cfg_path), "--runs-dir", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "epoch 1/2 step" in err and "val acc" in err and "epoch 2/2 step" in err
    assert main(["train", str(cfg_path), "--runs-dir", str(tmp_path / "b"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
