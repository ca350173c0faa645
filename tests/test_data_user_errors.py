"""A user's bad data or model is a FathomError naming the fix, never a traceback: an empty or
torn ``.npz``, labels beyond the model's outputs (cross entropy's ``IndexError``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fathom.config import validate_run_config
from fathom.errors import FathomError
from fathom.train.loop import train
from test_train_kinds import user_config, user_files


@pytest.fixture
def user(tmp_path, monkeypatch):
    _, npz = user_files(tmp_path, n=120)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("usermodels", None)
    return npz


@pytest.mark.parametrize("damage", ["empty", "torn", "not a zip"])
def test_an_unreadable_npz_is_refused_naming_the_file(tmp_path: Path, user: Path, damage) -> None:
    data = user.read_bytes()
    bad = tmp_path / "bad.npz"
    bad.write_bytes({"empty": b"", "torn": data[: len(data) // 2], "not a zip": b"x" * 64}[damage])
    cfg = validate_run_config(user_config(bad))
    with pytest.raises(FathomError, match=r"bad\.npz' is not a readable \.npz .*numpy\.savez"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "manifest.json").exists()


@pytest.mark.parametrize("outputs", [2, 1])
def test_labels_beyond_the_models_outputs_are_refused_before_training(
    tmp_path: Path, user: Path, outputs: int
) -> None:
    """Labels 0..2 (3 classes) with a model of ``outputs`` < 3 logits."""
    cfg = validate_run_config(
        user_config(user, model={"kwargs": {"in_features": 12, "classes": outputs}})
    )
    with pytest.raises(
        FathomError, match=rf"returns {outputs} logits per example but the data's labels run to 2"
    ):
        train(cfg, tmp_path / "run")


def test_a_model_of_more_outputs_than_classes_trains(tmp_path: Path, user: Path) -> None:
    cfg = validate_run_config(
        user_config(
            user,
            model={"kwargs": {"in_features": 12, "classes": 5}},
            optim={"epochs": 1},
            checkpoints={"save_epochs": [0]},
        )
    )
    assert train(cfg, tmp_path / "run").status == "complete"


def test_a_forward_that_fails_on_the_data_is_refused(tmp_path: Path, user: Path) -> None:
    cfg = validate_run_config(user_config(user, model={"kwargs": {"in_features": 7, "classes": 3}}))
    with pytest.raises(FathomError, match=r"forward fails on the data's inputs \(shape \[12\]"):
        train(cfg, tmp_path / "run")


def test_the_check_leaves_the_model_and_rng_untouched() -> None:
    import torch

    from fathom.models.factory import check_logits

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.5)).train()
    model[0].eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.random.get_rng_state()
    check_logits(model, torch.randn(2, 4, generator=torch.Generator().manual_seed(0)), 3, "m")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert [m.training for m in model.modules()] == [True, False, True]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
