"""Fathom in a notebook: ``fathom.load_run`` / ``fathom.load_study`` (verified, typed, the
history in display units), ``with Instruments(...)``, "did you mean" for a family name, and
a branch that changes the width refused by name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fathom
from fathom.errors import FathomError


def _raw_history(run: Path) -> list[dict]:
    """The history as the file holds it, parsed here without Fathom (the reference)."""
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def test_load_run_is_typed_and_its_history_is_in_display_units(trained_tiny_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # no pandas: a list of dicts
    run = fathom.load_run(trained_tiny_run)
    assert isinstance(run.manifest, fathom.rundir.RunManifest)
    assert run.manifest.status == run.status == "complete"
    raw = _raw_history(trained_tiny_run)
    rows = run.history
    assert isinstance(rows, list) and len(rows) == len(raw) == run.manifest.epochs_completed + 1
    for got, want in zip(rows, raw, strict=True):
        for split in ("fit", "val", "test"):
            assert got[f"{split}/acc_pct"] == pytest.approx(100.0 * want[f"{split}/acc"], rel=1e-15)
            assert f"{split}/acc" not in got and got[f"{split}/ce"] == want[f"{split}/ce"]
        assert got["epoch"] == want["epoch"] and got["clock/training_s"] == want["clock/training_s"]
    assert "status='complete'" in repr(run) and "checkpoints=[0, 1, 2, 3]" in repr(run)


def test_history_is_a_dataframe_with_units_when_pandas_is_there(trained_tiny_run):
    pd = pytest.importorskip("pandas")
    frame = fathom.load_run(trained_tiny_run).history
    assert isinstance(frame, pd.DataFrame)
    raw = _raw_history(trained_tiny_run)
    np.testing.assert_array_equal(frame["val/acc_pct"], [100.0 * r["val/acc"] for r in raw])
    units = frame.attrs["units"]
    assert units["val/acc_pct"] == "%" and units["val/ce"] == "nats"
    assert units["clock/training_s"] == "s" and set(units) <= set(frame.columns)


def test_checkpoint_is_the_saved_state_dict_verified_against_its_digest(tiny_run_copy):
    from safetensors.torch import load_file

    from fathom.base.io import state_dict_digest

    run = fathom.load_run(tiny_run_copy)
    entry = run.manifest.checkpoints["2"]
    state = run.checkpoint(2)
    on_disk = load_file(tiny_run_copy / entry.file)
    assert state.keys() == on_disk.keys()
    assert all(torch.equal(state[k], on_disk[k]) for k in state)
    assert state_dict_digest(state) == entry.params_sha256
    assert torch.equal(run.checkpoint("final")["stem.weight"], run.checkpoint(3)["stem.weight"])
    with pytest.raises(
        FathomError, match="no checkpoint for epoch 7; saved epochs: \\[0, 1, 2, 3\\]"
    ):
        run.checkpoint(7)
    data = bytearray((tiny_run_copy / entry.file).read_bytes())
    data[-1] ^= 0xFF  # one flipped bit of one tensor
    (tiny_run_copy / entry.file).write_bytes(bytes(data))
    with pytest.raises(FathomError, match="epoch-0002"):
        run.checkpoint(2)


def test_a_damaged_or_misplaced_run_is_refused_naming_the_fix(tiny_run_copy, tmp_path):
    history = tiny_run_copy / "history.jsonl"
    history.write_text(history.read_text().replace('"epoch": 1,', '"epoch": 1, "x": 0,', 1))
    with pytest.raises(FathomError, match="fails its integrity checks: .*modified"):
        fathom.load_run(tiny_run_copy)
    with pytest.raises(FathomError, match="not a run directory"):
        fathom.load_run(tmp_path / "nothing")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "study.json").write_text("{}")
    with pytest.raises(FathomError, match="is a study directory, not a run: .*load_study"):
        fathom.load_run(tmp_path / "study")
    with pytest.raises(FathomError, match="is a run directory, not a study: .*load_run"):
        fathom.load_study(tiny_run_copy)


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory) -> Path:
    from conftest import synthetic_splits
    from fathom.study.backends import LocalBackend
    from fathom.study.config import validate_study_config
    from fathom.study.runner import run_study

    runs = tmp_path_factory.mktemp("nb") / "runs"
    study = validate_study_config(
        {
            "study": {"name": "nb", "reference": "residual", "recipes": ["residual"]}
            | {"seeds": [101, 102], "lr": 0.05},
            "tuning": {"enabled": False},
            "base": {
                "device": "cpu",
                "model": {"widths": [16, 12, 10, 8, 8]},
                "optim": {"epochs": 1, "batch_size": 64},
            },
        }
    )
    backend = LocalBackend(splits_for=lambda cfg, device: synthetic_splits(n_fit=128, n_eval=64))
    run_study(study, runs, backend)
    return runs / "nb"


def test_load_study_holds_its_config_and_verified_runs(tiny_study, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    study = fathom.load_study(tiny_study)
    assert study.config.study.name == "nb"
    assert sorted(study.runs) == ["main-residual-s101", "main-residual-s102"]
    run = study.run("main-residual-s102")
    assert run.config.seed == 102 and run.status == "complete"
    rows = study.history
    assert len(rows) == sum(len(_raw_history(r.path)) for r in study.runs.values())
    assert {(r["run_id"], r["seed"], r["recipe"], r["phase"]) for r in rows} == {
        ("main-residual-s101", 101, "residual", "main"),
        ("main-residual-s102", 102, "residual", "main"),
    }
    assert all(r["lr"] == 0.05 and "val/acc_pct" in r for r in rows)
    assert [r["status"] for r in study.status()] == ["complete", "complete"]
    assert "2 complete" in repr(study)
    with pytest.raises(FathomError, match="did you mean 'main-residual-s101'"):
        study.run("main-residual-s1O1")


# -- instruments and modules in a notebook ---------------------------------------------
def _hooks(model: nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        for m in model.modules()
    )


def test_instruments_as_a_context_manager_leaves_the_model_as_found():
    from fathom.depth import SkippableResidual

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), SkippableResidual(nn.Linear(8, 8)), nn.Linear(8, 3))
    model.train()
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with fathom.Instruments(model, x, y, families="cheap") as ins:
        row = ins.observe()
        assert _hooks(model) == 0  # observing holds no hook between calls
    assert row["probe/ce"] > 0 and ins.closed
    assert _hooks(model) == 0 and model.training and all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert ins.initial == {} and ins._seam is None  # the model's copies are let go
    with pytest.raises(FathomError, match="closed .*create a new one"):
        ins.observe()


def test_instruments_context_closes_when_its_block_raises():
    model = nn.Sequential(nn.Linear(4, 3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(KeyError), fathom.Instruments(model, x, y, families="probe") as ins:
        raise KeyError("in the block")
    assert ins.closed


@pytest.mark.parametrize(
    ("family", "hint"),
    [
        ("grad", "gradients"),
        ("moment", "moments"),
        ("activation", "activations"),
        ("cheep", "cheap"),
    ],
)
def test_a_misspelt_family_gets_a_suggestion(family, hint):
    model = nn.Sequential(nn.Linear(4, 3))
    with pytest.raises(
        FathomError, match=f"unknown telemetry family '{family}' \\(did you mean '{hint}'\\?\\)"
    ):
        fathom.Instruments(model, torch.randn(4, 4), torch.randint(0, 3, (4,)), families=family)


def test_a_family_far_from_every_name_gets_the_list_only():
    with pytest.raises(FathomError) as err:
        fathom.Instruments(
            nn.Linear(4, 3), torch.randn(4, 4), torch.zeros(4, dtype=torch.long), families="zzz"
        )
    assert "did you mean" not in str(err.value) and "valid families: probe" in str(err.value)


@pytest.mark.parametrize("gain", [None, 0.5, "tensor"])
def test_a_branch_that_changes_the_width_is_refused_by_name(gain):
    from fathom.depth import SkippableResidual
    from fathom.depth.residual import skippable_residual

    block = SkippableResidual(nn.Sequential(nn.Linear(8, 16), nn.ReLU()), p=0.2).eval()
    x = torch.randn(3, 8)
    with pytest.raises(FathomError) as err:
        if gain is None:
            block(x)  # eval: gain one
        else:
            g = torch.tensor(0.5) if gain == "tensor" else gain
            skippable_residual(x, block.branch, block.bypass, g)
    text = str(err.value)
    assert (
        "SkippableResidual: its branch Sequential(" in text
        and "Linear(in_features=8, out_features=16" in text
    )
    assert "returns [3, 16] but its bypass Identity() returns [3, 8]" in text
    assert "bypass=nn.Linear(8, 16)" in text


def test_a_conv_branch_that_changes_channels_names_a_conv_shortcut_and_a_dropped_one_runs():
    from fathom.depth import SkippableResidual

    block = SkippableResidual(nn.Conv2d(3, 8, 3, padding=1)).eval()
    with pytest.raises(FathomError, match=r"bypass=nn\.Conv2d\(3, 8, 1\)"):
        block(torch.randn(2, 3, 5, 5))
    block.gain = 0.0  # a dropped branch is not computed: nothing to add, nothing refused
    assert block.train()(torch.randn(2, 3, 5, 5)).shape == (2, 3, 5, 5)


def test_a_projection_shortcut_and_a_broadcasting_bypass_still_add():
    from fathom.depth import SkippableResidual

    torch.manual_seed(0)
    proj = SkippableResidual(nn.Linear(8, 16), bypass=nn.Linear(8, 16)).eval()
    x = torch.randn(3, 8)
    assert torch.equal(proj(x), proj.bypass(x) + proj.branch(x))
    wide = SkippableResidual(nn.Linear(4, 4), bypass=lambda h: h.sum(0)).eval()
    x = torch.randn(2, 4)
    assert torch.equal(wide(x), x.sum(0) + wide.branch(x))


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 3),
    width_in=st.integers(1, 5),
    width_out=st.integers(1, 5),
    bypass_out=st.sampled_from(["identity", "sum0", "ones"]),
    gain=st.sampled_from([1.0, 0.5, "tensor"]),
)
def test_a_branch_and_its_bypass_add_exactly_or_are_refused_by_name(
    rows, width_in, width_out, bypass_out, gain
):
    """Refused or exact: a branch output either adds to the bypass's as torch adds them
    (broadcasting included, the same bits as ``bypass(x) + g * branch(x)``), or a
    FathomError names both modules and the shapes; never torch's bare shape error."""
    from fathom.depth.residual import skippable_residual

    torch.manual_seed(0)
    branch = nn.Linear(width_in, width_out)
    bypass = {
        "identity": nn.Identity(),
        "sum0": lambda h: h.sum(0),
        "ones": lambda h: torch.ones(h.shape[0], 1),
    }[bypass_out]
    x = torch.randn(rows, width_in)
    g = torch.tensor(0.5) if gain == "tensor" else gain
    skip, out = bypass(x), branch(x)
    try:  # the reference: numpy's broadcasting rule, independent of torch and of Fathom
        np.broadcast_shapes(tuple(skip.shape), tuple(out.shape))
        adds = True
    except ValueError:
        adds = False
    if not adds:
        with pytest.raises(FathomError, match=r"its branch Linear\(.* returns .* but its bypass"):
            skippable_residual(x, branch, bypass, g)
        return
    got = skippable_residual(x, branch, bypass, g)
    assert torch.equal(got, skip + out if gain == 1.0 else skip + out * g)
