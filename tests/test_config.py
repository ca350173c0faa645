"""Config validation: every number of the config family is a real, finite number of its type."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.config import RunConfig, validate_run_config
from fathom.depthscale.config import DepthScaleConfig
from fathom.errors import FathomError
from fathom.study.config import validate_study_config

BAD_RUNS = [
    ("lr inf", {"optim": {"lr": math.inf}}, "optim.lr: Input should be a finite number"),
    ("lr nan", {"optim": {"lr": math.nan}}, "optim.lr: Input should be a finite number"),
    ("momentum -inf", {"optim": {"momentum": -math.inf}}, "optim.momentum"),
    ("epochs true", {"optim": {"epochs": True}}, "optim.epochs: Input should be a valid integer"),
    ("epochs 2.0", {"optim": {"epochs": 2.0}}, "optim.epochs: Input should be a valid integer"),
    ("lr true", {"optim": {"lr": True}}, "optim.lr: Input should be a valid number"),
    ("lr string", {"optim": {"lr": "0.1"}}, "optim.lr: Input should be a valid number"),
    ("seed true", {"seed": True}, "seed: Input should be a valid integer"),
    ("widths bool", {"model": {"widths": [8, True]}}, "widths.1: Input should be a valid integer"),
    (
        "schedule nan",
        {"optim": {"schedule": {"kind": "piecewise", "points": [[0, math.nan]]}}},
        "optim.schedule.points.0.1",
    ),
    ("telemetry on=1", {"telemetry": {"enabled": 1}}, "telemetry.enabled"),
]


@pytest.mark.parametrize("case", BAD_RUNS, ids=[c[0] for c in BAD_RUNS])
def test_non_finite_and_mistyped_numbers_are_refused(case):
    _, data, needle = case
    with pytest.raises(FathomError) as e:
        validate_run_config(data, origin="case")
    assert needle in str(e.value)


def test_integers_are_accepted_for_floats_and_set_parses_infinity_as_an_error():
    assert validate_run_config({"optim": {"lr": 1}}).optim.lr == 1.0
    with pytest.raises(FathomError, match="finite number"):
        RunConfig().with_updates({"optim.lr": float("inf")})


def test_cli_set_lr_infinity_is_refused(capsys):
    from fathom.cli import main

    assert main(["train", "--set", "optim.lr=Infinity"]) == 2
    assert "optim.lr: Input should be a finite number" in capsys.readouterr().err


def test_study_and_depth_scaling_configs_are_strict_too():
    with pytest.raises(FathomError, match="tuning.lrs.1: Input should be a finite number"):
        validate_study_config(
            {"study": {"name": "s", "recipes": ["residual"]}, "tuning": {"lrs": [0.1, math.inf]}},
            "case",
        )
    with pytest.raises(ValueError, match="finite number"):
        DepthScaleConfig(lr=math.nan)
    with pytest.raises(ValueError, match="valid integer"):
        DepthScaleConfig(epochs=True)


@settings(max_examples=80)
@given(
    epochs=st.integers(1, 12),
    key=st.sampled_from(["eval.first", "checkpoints.save_epochs", "telemetry.first"]),
    values=st.lists(st.integers(-3, 15), max_size=4),
)
@example(epochs=5, key="eval.first", values=[-5])
@example(epochs=5, key="checkpoints.save_epochs", values=[99])
@example(epochs=5, key="checkpoints.save_epochs", values=[-1])
def test_epoch_lists_lie_within_training(epochs: int, key: str, values: list[int]) -> None:
    """Every listed epoch is in 0..optim.epochs, or the config is refused naming the key."""
    updates = {"optim.epochs": epochs, key: values, "telemetry.enabled": True}
    if all(0 <= e <= epochs for e in values):
        section, field = key.split(".")
        cfg = RunConfig().with_updates(updates)
        assert list(getattr(getattr(cfg, section), field)) == values
    else:
        with pytest.raises(FathomError, match=key.replace(".", r"\.")):
            RunConfig().with_updates(updates)


def test_the_default_snapshot_schedule_is_cut_at_training_not_refused() -> None:
    from fathom.config import DEFAULT_SAVE_EPOCHS

    cfg = RunConfig().with_updates({"optim.epochs": 3})
    assert cfg.checkpoints.save_epochs == DEFAULT_SAVE_EPOCHS
    assert RunConfig.model_validate(cfg.model_dump(mode="json")) == cfg  # reads back


def test_a_config_change_is_never_described_by_an_empty_diff(tmp_path) -> None:
    """The resume check names what differs; where every value agrees (a hand-written or
    edited manifest whose hash is not its config's digest) it says so instead of ``()``."""
    from fathom.config import describe_config_change
    from fathom.train.loop import check_resumable
    from synthetic_runs import synthetic_history, write_run

    a = RunConfig().model_dump(mode="json")
    b = RunConfig().with_updates({"optim.lr": 0.03}).model_dump(mode="json")
    assert describe_config_change(a, "x", b) == "optim.lr: 0.01 != 0.03"
    assert "recorded config_hash abc" in describe_config_change(a, "abc", a)
    run = write_run(
        tmp_path / "s" / "r",
        study="s",
        recipe="plain",
        seed=1,
        lr=0.1,
        rows=synthetic_history(1, [0, 1]),
        status="running",
    )
    from fathom.rundir import RunDir

    cfg = RunDir(run).config
    with pytest.raises(FathomError, match=r"another config \(every value agrees, but the recorded"):
        check_resumable(run, cfg)
