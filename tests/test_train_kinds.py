"""Models and data by kind through the one trainer: a user's python model on a user's
``.npz``, AdamW, learning-rate schedules, clear errors, and SIGKILL + resume."""

from __future__ import annotations

import math
import random
import signal
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fathom.cli import main
from fathom.config import OptimConfig, ScheduleConfig, validate_run_config
from fathom.data.prepare import prepare_splits
from fathom.errors import FathomError
from fathom.io import read_jsonl
from fathom.rundir import RunDir
from fathom.train.build import build_optimizer
from fathom.train.loop import train
from fathom.train.schedule import epoch_lrs, multiplier

USER_MODULE = """
import torch
from torch import nn


def mlp(in_features=12, hidden=16, classes=3):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.Tanh(),
                         nn.Linear(hidden, classes))


def not_a_module():
    return 3


def blobs(n=300):
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    return {"x": torch.randn(n, 12, generator=g) + y[:, None].float(), "y": y}
"""


def user_files(tmp_path: Path, n: int = 600) -> tuple[Path, Path]:
    """``usermodels.py`` (factories) and ``blobs.npz`` (x float32 [n, 12], y in 0..2)."""
    (tmp_path / "usermodels.py").write_text(USER_MODULE)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    x = (rng.standard_normal((n, 12)) + y[:, None]).astype(np.float32)
    np.savez(tmp_path / "blobs.npz", x=x, y=y)
    return tmp_path / "usermodels.py", tmp_path / "blobs.npz"


def user_config(npz: Path, **extra) -> dict:
    data = {
        "name": "u",
        "study": "user",
        "seed": 3,
        "device": "cpu",
        "data": {"dataset": "tensors", "path": str(npz)},
        "model": {
            "kind": "python",
            "factory": "usermodels:mlp",
            "kwargs": {"in_features": 12, "hidden": 16, "classes": 3},
        },
        "optim": {
            "name": "adamw",
            "lr": 0.01,
            "weight_decay": 0.01,
            "batch_size": 16,
            "epochs": 3,
            "schedule": {"kind": "warmup_cosine", "warmup_epochs": 1, "warmup_start": 0.1},
        },
        "eval": {"every": 1},
        "checkpoints": {"save_epochs": [0, 3]},
    }
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


@pytest.fixture
def user(tmp_path, monkeypatch):
    _, npz = user_files(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("usermodels", None)
    return npz


def test_user_model_on_user_npz_trains_and_records_its_data(tmp_path, user):
    cfg = validate_run_config(user_config(user))
    res = train(cfg, tmp_path / "run")
    assert res.status == "complete"
    rd = RunDir(tmp_path / "run")
    m = rd.manifest
    assert m["data"]["files"] == {"blobs.npz": __import__("fathom.io").io.sha256_file(user)}
    assert m["data"]["sizes"] == {"fit": 486, "val": 54, "test": 60}
    assert m["data"]["info"]["classes"] == 3 and m["model"]["kind"] == "python"
    rows = rd.history()
    assert rows[0]["optim/lr"] is None
    steps = math.ceil(486 / 16)
    for row in rows[1:]:
        assert row["optim/lr"] == epoch_lrs(cfg.optim, row["epoch"], steps)[-1]
    assert rows[-1]["val/acc"] > 0.5  # the blobs are separable
    model = rd.load_model("final")
    assert isinstance(model, torch.nn.Sequential)
    splits = rd.load_splits()
    assert splits.fit_x.dtype == torch.float32 and splits.fit_x.shape[1:] == (12,)


def test_a_single_set_is_split_by_the_split_seed(user):
    cfg = validate_run_config(user_config(user))
    a = prepare_splits(cfg.data)
    b = prepare_splits(cfg.data.model_copy(update={"split_seed": 1}))
    assert a.split_hash != b.split_hash
    all_x = torch.cat([a.fit_x, a.val_x, a.test_x])
    assert all_x.shape[0] == 600
    other = torch.cat([b.fit_x, b.val_x, b.test_x])
    assert not torch.equal(all_x, other)  # another permutation of the same examples
    assert torch.equal(all_x[all_x[:, 0].argsort()], other[other[:, 0].argsort()])


def test_python_dataset_factory_is_hashed_by_content(user):
    cfg = validate_run_config(
        user_config(user, data={"dataset": "python", "path": None, "factory": "usermodels:blobs"})
    )
    s = prepare_splits(cfg.data)
    assert (
        list(s.info["files"]) == ["factory-arrays"] and len(s.info["files"]["factory-arrays"]) == 64
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": {"factory": "nosuchmodule:mlp"}}, "cannot import module 'nosuchmodule'"),
        ({"model": {"factory": "usermodels:nope"}}, "has no attribute 'nope'"),
        ({"model": {"factory": "usermodels:not_a_module", "kwargs": {}}}, "not a torch.nn.Module"),
        ({"model": {"kwargs": {"widht": 3}}}, "keyword arguments"),
    ],
)
def test_bad_user_models_are_named(tmp_path, user, change, message):
    cfg = validate_run_config(user_config(user, **change))
    with pytest.raises(FathomError, match=message):
        train(cfg, tmp_path / "bad")


def test_factory_path_syntax_is_checked_at_validation(user):
    with pytest.raises(FathomError, match="package.module:function"):
        validate_run_config(user_config(user, model={"factory": "usermodels.mlp"}))


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((5, 3), np.float32), "y": np.zeros(4, np.int64)}, "one label per example"),
        ({"x": np.full((5, 3), np.nan, np.float32), "y": np.zeros(5, np.int64)}, "15 NaN"),
        ({"x": np.zeros((5, 3), np.float32), "y": np.zeros(5, np.float32)}, "integer array"),
        (
            {
                "train_x": np.zeros((5, 3), np.float32),
                "train_y": np.zeros(5, np.int64),
                "test_x": np.zeros((5, 4), np.float32),
                "test_y": np.ones(5, np.int64),
            },
            "example shapes",
        ),
        ({"inputs": np.zeros((5, 3))}, "give x/y"),
    ],
)
def test_bad_user_tensors_are_named(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    cfg = validate_run_config({"data": {"dataset": "tensors", "path": str(tmp_path / "bad.npz")}})
    with pytest.raises(FathomError, match=message):
        prepare_splits(cfg.data)


def test_adamw_skipped_parameters_get_no_moment_step_or_decay():
    """A parameter with ``grad is None`` keeps its value, moments and step count."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    cfg = OptimConfig(name="adamw", lr=0.1, weight_decay=0.5)
    for impl in ("foreach", "for-loop"):
        opt = build_optimizer(model, cfg.model_copy(update={"impl": impl}))
        x = torch.randn(8, 4)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        skipped = model[0].weight
        before = (skipped.detach().clone(), {k: v.clone() for k, v in opt.state[skipped].items()})
        model(x).square().mean().backward()
        skipped.grad = None  # the branch was skipped on this step
        opt.step()
        opt.zero_grad(set_to_none=True)
        assert torch.equal(skipped.detach(), before[0])
        for key, value in opt.state[skipped].items():
            assert torch.equal(value, before[1][key]), key
        assert float(opt.state[skipped]["step"]) == 1.0
        assert float(opt.state[model[1].weight]["step"]) == 2.0


def test_schedule_values_against_their_formulas():
    E = 10
    const = ScheduleConfig()
    assert multiplier(const, 3.7, E) == 1.0
    lin = ScheduleConfig(kind="warmup_linear", warmup_epochs=2, warmup_start=0.2, final=0.1)
    assert multiplier(lin, 0.0, E) == pytest.approx(0.2)
    assert multiplier(lin, 1.0, E) == pytest.approx(0.6)
    assert multiplier(lin, 2.0, E) == pytest.approx(1.0)
    assert multiplier(lin, 6.0, E) == pytest.approx(1.0 + (0.1 - 1.0) * 0.5)
    assert multiplier(lin, 10.0, E) == pytest.approx(0.1)
    cos = ScheduleConfig(kind="warmup_cosine")
    for t in (0.0, 2.5, 5.0, 9.9):
        assert multiplier(cos, t, E) == pytest.approx(0.5 * (1 + math.cos(math.pi * t / E)))
    exp = ScheduleConfig(kind="exponential", gamma=0.9)
    assert [multiplier(exp, t, E) for t in (0.0, 0.99, 1.0, 3.5)] == pytest.approx(
        [1.0, 1.0, 0.9, 0.9**3]
    )
    pw = ScheduleConfig(kind="piecewise", points=((0, 0.0), (1, 1.0), (5, 0.0)))
    assert multiplier(pw, 3.0, E) == pytest.approx(0.5)
    optim = OptimConfig(lr=0.1, epochs=E, schedule=exp)
    assert epoch_lrs(optim, 3, 4) == pytest.approx([0.1 * 0.9**2] * 4)
    optim = OptimConfig(lr=0.1, epochs=E, schedule=cos)
    assert epoch_lrs(optim, 2, 4)[1] == pytest.approx(0.1 * multiplier(cos, 1.25, E))
    assert OptimConfig(lr=0.3).model_copy().schedule.kind == "constant"
    assert epoch_lrs(OptimConfig(lr=0.3), 5, 3) == [0.3, 0.3, 0.3]  # exactly the base rate


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({"kind": "exponential"}, "needs gamma"),
        ({"kind": "piecewise"}, "needs points"),
        ({"kind": "piecewise", "points": [[2, 1.0], [1, 0.5]]}, "increasing epochs"),
        ({"kind": "constant", "gamma": 0.5}, "only used with kind 'exponential'"),
    ],
)
def test_bad_schedules_are_named(schedule, message):
    with pytest.raises(FathomError, match=message):
        validate_run_config({"optim": {"schedule": schedule}})


def _toml(path: Path, npz: Path, epochs: int) -> Path:
    path.write_text(
        textwrap.dedent(f"""
        name = "u"
        study = "user"
        seed = 3
        device = "cpu"
        [data]
        dataset = "tensors"
        path = "{npz}"
        [model]
        kind = "python"
        factory = "usermodels:mlp"
        kwargs = {{ in_features = 12, hidden = 64, classes = 3 }}
        [optim]
        name = "adamw"
        lr = 0.003
        batch_size = 4
        epochs = {epochs}
        schedule = {{ kind = "exponential", gamma = 0.9 }}
        [eval]
        every = 1
        """)
    )
    return path


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("clock/")} for r in rows]


def test_user_model_resume_after_sigkill_is_byte_identical(tmp_path, monkeypatch, forked):
    # the user's module is importable from the working directory, as for ``fathom train``
    # there; the reference and the resume run in this process, the victim is a real process
    # (a fork of this one, :mod:`forked`) killed by SIGKILL at a moment it cannot choose
    _, npz = user_files(tmp_path, n=2000)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("usermodels", None)
    cfg = _toml(tmp_path / "user.toml", npz, epochs=8)
    assert main(["train", str(cfg), "--runs-dir", str(tmp_path / "ref"), "--quiet"]) == 0
    sys.modules.pop("usermodels", None)  # the victim imports the user's module afresh
    victim = forked(["train", str(cfg), "--runs-dir", str(tmp_path / "v"), "--quiet"])
    run_dir = tmp_path / "v" / "user" / "u"
    deadline = time.time() + 300
    while time.time() < deadline:
        rows, _ = read_jsonl(run_dir / "history.jsonl") if run_dir.exists() else ([], [])
        if len(rows) >= 3:
            break
        assert victim.poll() is None, victim.output()
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 0.3))
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    assert RunDir(run_dir).status == "running"
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    sys.modules.pop("usermodels", None)
    mine, theirs = RunDir(run_dir), RunDir(tmp_path / "ref" / "user" / "u")
    assert mine.status == "complete"
    for key in ("final_params", "training_order", "initial_params"):
        assert mine.manifest["hashes"][key] == theirs.manifest["hashes"][key], key
    assert _comparable(mine.history()) == _comparable(theirs.history())


def staged_conv_config(**updates) -> dict:
    cfg = {
        "name": "sc",
        "study": "test",
        "seed": 7,
        "device": "cpu",
        "data": {"augment": "crop_flip"},
        "model": {"kind": "staged_conv", "depth": 4, "timesteps": 2, "width_mult": 0.0625},
        "optim": {
            "lr": 0.05,
            "nesterov": True,
            "batch_size": 32,
            "epochs": 3,
            "schedule": {"kind": "warmup_cosine"},
        },
        "regularizer": {"weight": 0.3, "sub_batch": 4},
        "health": {"enabled": True, "every": 2, "probe_size": 3},
        "eval": {"every": 1},
        "checkpoints": {"save_epochs": [0, 3]},
    }
    cfg.update(updates)
    return cfg


def test_regularized_staged_conv_run_resumes_byte_identically_and_rebuilds(tmp_path):
    from conftest import synthetic_splits

    splits = synthetic_splits(n_fit=96, n_eval=16)
    splits.info["dataset"] = "mnist"
    cfg = validate_run_config(staged_conv_config())
    full = train(cfg, tmp_path / "full", splits=splits)
    assert full.status == "complete"
    rows = full.history
    assert [r["lyap/maximal"] is not None for r in rows] == [True, False, True, True]
    assert all(r["grad_norm/penalty"] is not None and r["train/penalty"] >= 0 for r in rows[1:])
    assert all(r["spike/rates"] for r in rows if r["lyap/maximal"] is not None)  # LIF: spiking
    assert RunDir(tmp_path / "full").manifest["execution"]["path"] == "regularized"

    def interrupt_after_epoch_2(event, row):
        if row["epoch"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "part", splits=splits, progress=interrupt_after_epoch_2)
    resumed = train(cfg, tmp_path / "part", splits=splits, resume=True)
    assert resumed.final_params == full.final_params
    assert _comparable(resumed.history) == _comparable(full.history)

    rd = RunDir(tmp_path / "full")
    model = rd.load_model("final")
    from fathom.io import state_dict_digest
    from fathom.rundir.weights import cpu_state

    assert state_dict_digest(cpu_state(model)) == full.final_params
    x = splits.test_x[:5]
    assert model(x).shape == (5, 10)


def test_vanilla_arm_is_the_unregularized_step_bit_for_bit(tmp_path):
    """λ_reg = 0 through the regularized step equals plain CE training (eager stepper)."""
    from conftest import synthetic_splits

    splits = synthetic_splits(n_fit=64, n_eval=8)
    splits.info["dataset"] = "mnist"
    base = staged_conv_config(health={"enabled": False}, data={"augment": "none"})
    base["model"]["timesteps"] = 0
    base["optim"]["epochs"] = 1
    base["checkpoints"]["save_epochs"] = [0, 1]  # listed epochs lie within training
    reg = validate_run_config({**base, "regularizer": {"weight": 0.0}})
    plain = validate_run_config({**base, "regularizer": None, "execution": {"precision": "fp32"}})
    a = train(reg, tmp_path / "reg", splits=splits)
    b = train(plain, tmp_path / "plain", splits=splits)
    assert a.final_params == b.final_params
