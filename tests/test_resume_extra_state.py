"""A user's model whose SkippableResidual branches draw their own decisions (p > 0) resumes
exactly: the branches' generator states travel in the resume state (weights files and their
digests stay the tensors alone)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from fathom.config import validate_run_config
from fathom.rundir import RunDir
from fathom.train.loop import resume, train

MODULE = """
from torch import nn
from fathom.depth import SkippableResidual


def net(p=0.5, classes=3):
    blocks = [SkippableResidual(nn.Sequential(nn.Linear(16, 16), nn.Tanh()), p=p) for _ in range(3)]
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), *blocks, nn.Linear(16, classes))
"""


@pytest.fixture
def user(tmp_path, monkeypatch):
    import numpy as np

    (tmp_path / "selfdrop.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("selfdrop", None)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 240)
    x = (rng.standard_normal((240, 12)) + y[:, None]).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    return tmp_path / "d.npz"


def _config(npz: Path, optim: str, p: float):
    return validate_run_config(
        {
            "name": "u",
            "study": "s",
            "seed": 5,
            "device": "cpu",
            "data": {"dataset": "tensors", "path": str(npz)},
            "model": {"kind": "python", "factory": "selfdrop:net", "kwargs": {"p": p}},
            "optim": {"name": optim, "lr": 0.02, "batch_size": 16, "epochs": 4},
            "eval": {"every": 1},
            "checkpoints": {"save_epochs": [0, 4]},
        }
    )


def _stopped_at(cfg, run: Path, epoch: int) -> None:
    def stop(event: str, info: dict) -> None:
        if event == "epoch_end" and info["epoch"] == epoch:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, run, progress=stop)


def _scores(lines: list[str]) -> list[dict]:
    """History rows without their clocks (wall times differ between invocations)."""
    rows = [json.loads(line) for line in lines]
    return [{k: v for k, v in r.items() if not k.startswith("clock/")} for r in rows]


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
@pytest.mark.parametrize("p", [0.5, 0.0])
def test_self_sampling_branches_resume_byte_identical(tmp_path, user, optim, p) -> None:
    torch.manual_seed(0)
    cfg = _config(user, optim, p)
    whole = train(cfg, tmp_path / "whole")
    _stopped_at(cfg, tmp_path / "cut", epoch=3)
    resumed = resume(tmp_path / "cut")
    assert resumed.status == whole.status == "complete"
    assert resumed.final_params == whole.final_params
    a = (tmp_path / "whole" / "history.jsonl").read_text().splitlines()
    b = (tmp_path / "cut" / "history.jsonl").read_text().splitlines()
    assert _scores(a) == _scores(b)
    weights = RunDir(tmp_path / "whole").load_state("final")
    assert not [k for k in weights if k.endswith("_extra_state")]  # weights: tensors alone


def test_the_config_drives_a_python_models_branches_when_asked(tmp_path, user) -> None:
    """``[model] drop_probs``: the trainer's schedule overrides the branches' own ``p`` (here
    0, never dropping); the run resumes exactly and differs from the undriven run."""
    from fathom.errors import FathomError

    def cfg(**model):
        base = _config(user, "sgd", 0.0).model_dump(mode="json")
        base["model"].update(model)
        return validate_run_config(base)

    driven = cfg(drop_probs=[0.5, 0.5, 0.5], drop_schedule="linear_decrease")
    whole = train(driven, tmp_path / "whole")
    assert RunDir(tmp_path / "whole").manifest["hashes"]["masks"] is not None
    _stopped_at(driven, tmp_path / "cut", epoch=2)
    assert resume(tmp_path / "cut").final_params == whole.final_params
    plain = train(cfg(), tmp_path / "plain")
    assert plain.final_params != whole.final_params
    with pytest.raises(FathomError, match="gives 2 probabilities but the model has 3"):
        train(cfg(drop_probs=[0.5, 0.5]), tmp_path / "bad")
    with pytest.raises(FathomError, match="drop_schedule needs model.drop_probs"):
        cfg(drop_schedule="linear_decrease")


def test_the_recorders_state_is_in_every_resume_state(tmp_path) -> None:
    """With telemetry on, resume.safetensors carries the recorder's ``state_dict`` (its schema record),
    as docs/architecture.md says; with telemetry off it carries none."""
    from conftest import synthetic_splits, tiny_config
    from fathom.rundir.files import load_resume

    data = synthetic_splits(n_fit=64, n_eval=32)
    for enabled in (True, False):
        updates = {"optim.epochs": 1, "telemetry.enabled": enabled, "telemetry.probe_size": 32}
        cfg = tiny_config(**updates)
        run = tmp_path / f"telemetry-{enabled}"
        assert train(cfg, run, splits=data).status == "complete"
        state = load_resume(run / "checkpoints" / "resume.safetensors")
        assert ("recorder" in state) is enabled
        if enabled:
            assert state["recorder"] == {"schema_changes": []}
