"""Studies: config validation and bad input, LR selection with a diverged grid point,
summaries, resume after the study process is killed, configs that changed."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from fathom.data import DataSplits
from fathom.errors import FathomError
from fathom.rundir import RunDir, seal
from fathom.study.backends import LocalBackend, make_backend
from fathom.study.config import load_study, preset_names, validate_study_config
from fathom.study.plan import tuning_specs
from fathom.study.registry import Registry, registry_path
from fathom.study.runner import run_study
from fathom.study.selection import GridPoint, select_lr
from fathom.study.status import study_status

TESTS_DIR = Path(__file__).resolve().parent


def synthetic_splits(cfg, device, n_fit: int = 256, n_eval: int = 128) -> DataSplits:
    """Ten Gaussian blobs in 28x28 uint8 images: learnable in a few epochs, seeded."""
    g = torch.Generator().manual_seed(1234)
    centres = torch.rand(10, 28, 28, generator=g) * 255

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, 10, (n,), generator=g)
        x = (centres[y] + 60 * torch.randn(n, 28, 28, generator=g)).clamp(0, 255).to(torch.uint8)
        return x.to(device), y.to(device)

    fx, fy = draw(n_fit)
    vx, vy = draw(n_eval)
    tx, ty = draw(n_eval)
    return DataSplits(fx, fy, vx, vy, tx, ty, split_hash="synthetic-1234", info={"classes": 10})


def study_data(name: str = "t", **over) -> dict:
    data = {
        "study": {
            "name": name,
            "reference": "residual",
            "recipes": ["residual", "sd_constant"],
            "seeds": [101, 102],
        },
        "tuning": {"enabled": True, "seed": 1, "lrs": [0.05, 1e6]},
        "base": {
            "device": "cpu",
            "data": {"fit_subset": 256},
            "model": {"width_mult": 0.02},
            "optim": {"epochs": 2},
            "eval": {"every": 1},
            "checkpoints": {"save_epochs": [0, 2]},
        },
    }
    for section, values in over.items():
        data[section] = {**data[section], **values}
    return data


def local() -> LocalBackend:
    return LocalBackend(workers=1, threads=1, splits_for=synthetic_splits)


# ---------------------------------------------------------------------------------------
# Bad input


BAD_STUDIES = [
    ("empty recipes", {"study": {"recipes": []}}, "grid is empty"),
    ("empty seeds", {"study": {"seeds": []}}, "grid is empty"),
    ("empty lr grid", {"tuning": {"lrs": []}}, "learning-rate grid is empty"),
    (
        "reference missing",
        {"study": {"reference": "plain"}},
        "reference recipe 'plain' is not in recipes",
    ),
    ("unknown recipe", {"study": {"recipes": ["residual", "resnet"]}}, "unknown recipes"),
    ("base sets a study key", {"base": {"seed": 3}}, "[base] sets ['seed']"),
    ("base sets the lr", {"base": {"optim": {"lr": 0.1}}}, "optim.lr"),
    ("unknown key", {"tuning": {"lr_grid": [0.1]}}, "unknown key 'tuning.lr_grid'"),
    ("no lr without tuning", {"tuning": {"enabled": False}}, "set study.lr"),
    (
        "frozen without rates",
        {"tuning": {"mode": "frozen", "enabled": False, "lrs": [0.1]}},
        "needs tuning.lr",
    ),
    (
        "frozen with a recipe missing",
        {"tuning": {"mode": "frozen", "enabled": False, "lr": {"residual": 0.01}}},
        "missing ['sd_constant']",
    ),
    (
        "frozen rate for a recipe not studied",
        {
            "tuning": {
                "mode": "frozen",
                "enabled": False,
                "lr": {"residual": 0.01, "sd_constant": 0.01, "plain": 0.03},
            }
        },
        "not in study.recipes ['plain']",
    ),
    (
        "frozen and enabled",
        {"tuning": {"mode": "frozen", "enabled": True, "lr": {"residual": 0.01}}},
        "runs no tuning, but tuning.enabled = true",
    ),
    (
        "frozen and study.lr",
        {
            "tuning": {
                "mode": "frozen",
                "enabled": False,
                "lr": {"residual": 0.01, "sd_constant": 0.01},
            },
            "study": {"lr": 0.01},
        },
        "remove study.lr",
    ),
    (
        "rates without frozen",
        {"tuning": {"enabled": False, "lr": {"residual": 0.01, "sd_constant": 0.01}}},
        'used only with mode = "frozen"',
    ),
    (
        "negative frozen rate",
        {
            "tuning": {
                "mode": "frozen",
                "enabled": False,
                "lr": {"residual": -0.01, "sd_constant": 0.01},
            }
        },
        "must be positive",
    ),
]


@pytest.mark.parametrize("case", BAD_STUDIES, ids=[c[0] for c in BAD_STUDIES])
def test_bad_study_is_refused_with_the_fix(case):
    _, over, needle = case
    with pytest.raises(FathomError) as e:
        validate_study_config(study_data(**over), origin="case")
    assert needle in str(e.value)


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(FathomError) as e:
        load_study("ciresan-sd-fast")
    assert "valid presets: ciresan-sd, ciresan-sd-quick" in str(e.value)


def test_presets_are_valid_and_state_their_scale_down():
    assert {"ciresan-sd", "ciresan-sd-quick"} <= set(preset_names())
    full, _ = load_study("ciresan-sd")
    quick, _ = load_study("ciresan-sd-quick")
    assert (full.base.optim.epochs, full.base.optim.batch_size, full.base.model.width_mult) == (
        100,
        64,
        1.0,
    )
    assert full.study.scale_down == ()
    assert len(quick.study.recipes) == 5 and len(quick.study.seeds) >= 2
    assert quick.tuning.enabled and quick.tuning.lrs == (0.01, 0.03, 0.1)
    assert quick.base.model.width_mult < 1 and quick.base.data.fit_subset is not None
    assert len(quick.study.scale_down) >= 3


def test_fathom_validate_accepts_a_study_toml(tmp_path, capsys):
    from fathom.cli import main

    path = tmp_path / "s.toml"
    path.write_text(
        '[study]\nname = "x"\nreference = "residual"\nrecipes = ["residual"]\nseeds = [1]\n[tuning]\nenabled = true\n'
        "[base.model]\nwidths = [8, 8]\n"
    )
    assert main(["validate", str(path)]) == 0
    assert '"reference": "residual"' in capsys.readouterr().out


def test_missing_ray_extra_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    backend = make_backend("ray")
    with pytest.raises(FathomError, match=r"pip install -e '\.\[ray\]'"):
        backend.run([], retry_failed=False, registry_file=None)


# ---------------------------------------------------------------------------------------
# Learning-rate selection


def test_select_lr_takes_min_val_ce_ties_to_smaller_and_skips_divergence():
    pts = [
        GridPoint("a", 0.01, "r1", "complete", 0.30, 2, None),
        GridPoint("a", 0.03, "r2", "complete", 0.30, 2, None),
        GridPoint("a", 0.1, "r3", "diverged", None, None, 1),
        GridPoint("b", 0.01, "r4", "complete", 0.50, 2, None),
        GridPoint("b", 0.03, "r5", "complete", 0.20, 1, None),
    ]
    assert select_lr(pts) == {"a": 0.01, "b": 0.03}
    with pytest.raises(FathomError, match="no learning rate of the tuning grid trained recipe 'c'"):
        select_lr([GridPoint("c", 0.1, "r6", "diverged", None, None, 1)])


def test_study_with_a_diverged_grid_point(tmp_path):
    study = validate_study_config(study_data(), "test")
    result = run_study(study, tmp_path, local())
    s = result.summary
    grid = {(p["recipe"], p["lr"]): p for p in s["tuning"]["grid"]}
    for recipe in ("residual", "sd_constant"):
        assert grid[(recipe, 1e6)]["status"] == "diverged"
        assert grid[(recipe, 1e6)]["diverged_epoch"] == 1
        assert grid[(recipe, 1e6)]["val_ce"] is None
        assert grid[(recipe, 0.05)]["status"] == "complete"
        assert s["tuning"]["selected_lr"][recipe] == 0.05
    assert {r["lr"] for r in s["runs"].values()} == {0.05}
    assert all(r["status"] == "complete" and r["final_params"] for r in s["runs"].values())
    # summary files hold the stats module's tables and the tuning grid
    md = (result.root / "summary.md").read_text()
    assert "| residual | 1e+06 | diverged |" in md and "Selected test accuracy (%)" in md
    on_disk = json.loads((result.root / "summary.json").read_text())
    assert on_disk["stats"]["reference"] == "residual" and len(on_disk["stats"]["comparisons"]) == 4
    # the registry indexes all 8 runs, the divergences as data
    reg = Registry(registry_path(tmp_path))
    assert len(reg.query(study="t")) == 8
    assert {r["lr"] for r in reg.query(study="t", status="diverged")} == {1e6}
    # a rerun skips everything and keeps the hashes
    again = run_study(study, tmp_path, local())
    assert {o.action for o in again.outcomes} == {"skipped", "kept"}
    assert again.summary["runs"] == s["runs"]
    rows, _ = study_status(result.root)
    assert len(rows) == 8 and {r["status"] for r in rows} == {"complete", "diverged"}


def test_study_of_a_loss_tunes_and_selects_by_that_loss(tmp_path):
    """A study whose ``[base.loss]`` is mse: every grid point is ranked by its minimum
    validation mse (the run's ``selected.val_loss``), the rule and the tables say so."""
    base = {**study_data()["base"], "loss": {"name": "mse", "target": "one_hot"}}
    data = {
        **study_data(),
        "base": base,
        "tuning": {"enabled": True, "seed": 1, "lrs": [0.05, 0.2]},
    }
    result = run_study(validate_study_config(data, "test"), tmp_path, local())
    tuning = result.summary["tuning"]
    assert "validation loss (mse, mean)" in tuning["rule"]
    for recipe in ("residual", "sd_constant"):
        pts = [p for p in tuning["grid"] if p["recipe"] == recipe]
        for p in pts:
            sel = RunDir(result.root / p["run_id"]).manifest["selected"]
            assert p["objective"] == "val/loss" and p["val_loss"] == sel["val_loss"]
        best = min(pts, key=lambda p: (p["val_loss"], p["lr"]))
        assert tuning["selected_lr"][recipe] == best["lr"]
    md = (result.root / "summary.md").read_text()
    assert "Min validation loss" in md and "minimum validation loss: mse, mean" in md


def test_frozen_rates_run_no_tuning_and_are_recorded_per_recipe(tmp_path):
    frozen = {"residual": 0.05, "sd_constant": 0.02}
    # the grid of study_data (with a diverging 1e6) stays in the file but is not run
    study = validate_study_config(
        study_data(tuning={"mode": "frozen", "lr": frozen, "enabled": False}), "frozen"
    )
    assert tuning_specs(study, tmp_path) == [] and study.lr_source() == "frozen"
    events: list[str] = []
    result = run_study(
        study, tmp_path, local(), progress=lambda e, i: events.append(i if e == "phase" else "")
    )
    # no tuning run: no tune-* directory, every outcome a main run at its frozen rate
    assert not list(result.root.glob("tune-*"))
    assert {o.phase for o in result.outcomes} == {"main"} and len(result.outcomes) == 4
    for o in result.outcomes:
        assert o.lr == frozen[o.recipe]
        cfg = json.loads((Path(o.run_dir) / "manifest.json").read_text())["config"]
        assert cfg["optim"]["lr"] == frozen[o.recipe]
    s = result.summary
    assert s["tuning"]["enabled"] is False and s["tuning"]["mode"] == "frozen"
    assert s["tuning"]["grid"] == [] and s["tuning"]["selected_lr"] == frozen
    assert s["tuning"]["lr_source"] == {"residual": "frozen", "sd_constant": "frozen"}
    assert all(
        r["lr_source"] == "frozen" and r["lr"] == frozen[r["recipe"]] for r in s["runs"].values()
    )
    assert {r: e["lr"] for r, e in s["stats"]["recipes"].items()} == {
        "residual": [0.05],
        "sd_constant": [0.02],
    }
    md = (result.root / "summary.md").read_text()
    assert "| residual | 0.05 | frozen |" in md and "| sd_constant | 0.02 | frozen |" in md
    assert "no tuning run" in md
    assert any("learning rates from frozen (residual 0.05, sd_constant 0.02)" in e for e in events)
    on_disk = json.loads((result.root / "summary.json").read_text())
    assert on_disk["tuning"]["lr_source"] == s["tuning"]["lr_source"]
    rows, _ = study_status(result.root)
    assert [(r["phase"], r["lr"]) for r in rows] == [
        ("main", 0.05),
        ("main", 0.05),
        ("main", 0.02),
        ("main", 0.02),
    ]


def test_changed_base_config_is_refused_naming_the_field(tmp_path):
    run_study(
        validate_study_config(
            study_data(tuning={"enabled": False}, study={"lr": 0.05, "seeds": [101]}), "a"
        ),
        tmp_path,
        local(),
    )
    changed = study_data(tuning={"enabled": False}, study={"lr": 0.05, "seeds": [101]})
    changed["base"]["optim"] = {"epochs": 3}
    with pytest.raises(FathomError, match=r"optim\.epochs: 2 \(on disk\) != 3"):
        run_study(validate_study_config(changed, "b"), tmp_path, local())


def test_tampered_complete_run_is_refused(tmp_path):
    study = validate_study_config(
        study_data(tuning={"enabled": False}, study={"lr": 0.05, "seeds": [101]}), "a"
    )
    result = run_study(study, tmp_path, local())
    manifest = result.root / "main-residual-s101" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["hashes"]["final_params"] = "0" * 64
    manifest.write_text(json.dumps(m))
    with pytest.raises(FathomError, match="fails its digest check"):
        run_study(study, tmp_path, local())  # a hand edit breaks the manifest digest
    manifest.write_text(json.dumps(seal(m)))
    with pytest.raises(FathomError, match="does not match its final checkpoint"):
        run_study(study, tmp_path, local())  # a consistent manifest, wrong final hash


# ---------------------------------------------------------------------------------------
# Resume after the whole study process is killed

KILL_STUDY = {
    "study": {
        "name": "k",
        "reference": "residual",
        "recipes": ["residual", "sd_constant"],
        "seeds": [101],
        "lr": 0.01,
    },
    "tuning": {"enabled": False},
    "base": {
        "device": "cpu",
        "model": {"width_mult": 0.05},
        "optim": {"epochs": 8},
        "eval": {"every": 1},
        "checkpoints": {"save_epochs": [0, 8]},
    },
}


def _run_state(root: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for m in root.glob("*/manifest.json"):
        try:
            d = json.loads(m.read_text())
        except json.JSONDecodeError:
            continue
        out[m.parent.name] = (d["status"], d["epochs_completed"])
    return out


def test_killed_study_resumes_to_the_uninterrupted_hashes(tmp_path, forked):
    from functools import partial

    study = validate_study_config(KILL_STUDY, "kill")
    killed_dir = tmp_path / "killed"

    def the_study() -> None:  # in a process forked from this one (:mod:`forked`)
        run_study(study, killed_dir, LocalBackend(1, 1, partial(synthetic_splits, n_fit=1024)))

    proc = forked(the_study, new_session=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            state = _run_state(killed_dir / "k")
            # kill inside the second run, after at least two of its epoch boundaries
            if state.get("main-sd_constant-s101", ("", 0))[1] >= 2:
                break
            assert proc.poll() is None, (
                "the study finished before it could be killed; make it longer"
            )
            time.sleep(0.02)
        else:
            pytest.fail("the study did not reach the second run in time")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    state = _run_state(killed_dir / "k")
    assert state["main-residual-s101"][0] == "complete"
    assert state["main-sd_constant-s101"][0] == "running"
    assert state["main-sd_constant-s101"][1] < 8

    resumed = run_study(
        study, killed_dir, LocalBackend(1, 1, partial(synthetic_splits, n_fit=1024))
    )
    actions = {o.run_id: o.action for o in resumed.outcomes}
    assert actions == {"main-residual-s101": "skipped", "main-sd_constant-s101": "resumed"}
    straight = run_study(
        study, tmp_path / "straight", LocalBackend(1, 1, partial(synthetic_splits, n_fit=1024))
    )
    assert {k: v["final_params"] for k, v in resumed.summary["runs"].items()} == {
        k: v["final_params"] for k, v in straight.summary["runs"].items()
    }
    assert all(v["final_params"] for v in straight.summary["runs"].values())


def test_cli_status_runs_list_show_and_bad_preset(tmp_path, capsys):
    from fathom.cli import main

    study = validate_study_config(
        study_data(tuning={"enabled": False}, study={"lr": 0.05, "seeds": [101]}), "a"
    )
    result = run_study(study, tmp_path, local())
    assert main(["study", "status", str(result.root)]) == 0
    assert "2 complete, 0 diverged, 0 failed (2 runs)" in capsys.readouterr().out
    assert (
        main(["runs", "list", "--runs-dir", str(tmp_path), "--recipe", "sd_constant", "--json"])
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in rows] == ["main-sd_constant-s101"]
    assert main(["runs", "show", "main-residual-s101", "--runs-dir", str(tmp_path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["final_params"] == result.summary["runs"]["main-residual-s101"]["final_params"]
    # accuracy: a fraction only under a name that says so, the percent beside it
    assert "selected_test_acc" not in shown and "final_test_acc" not in shown
    for key in ("selected_test_acc", "final_test_acc"):
        assert shown[f"{key}_pct"] == pytest.approx(100 * shown[f"{key}_fraction"])
    assert main(["study", "run", "no-such-preset", "--runs-dir", str(tmp_path)]) == 2
    assert "valid presets" in capsys.readouterr().err
    assert main(["runs", "list", "--runs-dir", str(tmp_path / "empty")]) == 2


def test_seed_003_presets_freeze_the_seed_protocol():
    """Seed 002: 'frozen learning rates: .03 for plain and .01 for all residual recipes',
    seeds 101-103, 100 epochs, evaluation at epoch 1 and every 5, seven snapshots."""
    full, _ = load_study("ciresan-seed-003")
    quick, _ = load_study("ciresan-seed-003-quick")
    rates = {"plain": 0.03, **dict.fromkeys(RESIDUAL_RECIPES, 0.01)}
    for s in (full, quick):
        assert s.lr_source() == "frozen" and s.fixed_lrs() == rates
        assert tuning_specs(s, "runs") == [] and s.study.seeds == (101, 102, 103)
        assert s.base.model.input_scale == 1 / 255 and not s.base.model.output_relu
    assert full.base.optim.epochs == 100 and full.base.optim.batch_size == 64
    assert (full.base.eval.first, full.base.eval.every) == ((1,), 5)
    assert full.base.checkpoints.save_epochs == (0, 1, 5, 10, 20, 50, 100)
    assert full.study.scale_down == () and full.base.model.width_mult == 1.0
    assert quick.base.model.width_mult < 1 and len(quick.study.scale_down) >= 5
    # against the full (tuned) protocol: the full preset only changes how rates are chosen,
    # the quick one also reduces the network, data and epochs
    from fathom.study.scaledown import scaled_down

    full_items = scaled_down(full)
    assert [(d.key, d.kind) for d in full_items] == [("tuning.mode", "changed")]
    assert "frozen learning rates (plain 0.03, residual 0.01" in full_items[0].text
    reduced = {d.key for d in scaled_down(quick) if d.kind == "reduced"}
    assert {"base.model.width_mult", "base.data.fit_subset", "base.optim.epochs"} <= reduced


RESIDUAL_RECIPES = ("residual", "residual_dropout", "sd_constant", "sd_decreasing")
