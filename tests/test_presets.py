"""Every shipped preset validates, by kind; presets resolve by name; `fathom validate` dispatches."""

from __future__ import annotations

import pytest

from fathom.cli import main
from fathom.errors import FathomError
from fathom.study.config import load_study
from fathom.study.family import (
    load_config,
    load_run_config_or_preset,
    preset_names,
    validate_config,
)

ALL_PRESETS = [(kind, name) for kind, names in preset_names().items() for name in names]


@pytest.mark.parametrize(("kind", "name"), ALL_PRESETS)
def test_every_preset_validates_as_its_kind(kind, name):
    cfg, origin = load_config(name)
    assert cfg.kind == kind and name in origin
    if kind == "study":
        assert load_study(name)[0] == cfg


def test_fast_preset_is_the_optimized_baseline():
    assert "ciresan-fast" in preset_names()["run"]
    cfg = load_run_config_or_preset("ciresan-fast")
    assert cfg.model.recipe == "plain" and cfg.model.unit_dropout > 0
    assert cfg.data.split == "fit-all" and cfg.optim.batch_size == 256
    assert cfg.execution.precision == "bf16" and cfg.stop.target_test_acc == 0.9863
    assert cfg.optim.schedule.kind == "piecewise"
    with pytest.raises(FathomError, match="neither a config file nor a preset.*ciresan-fast"):
        load_run_config_or_preset("nope")


def test_train_refuses_other_kinds_with_a_pointer():
    with pytest.raises(FathomError, match="fathom depth-scaling quick"):
        load_run_config_or_preset("quick")
    with pytest.raises(FathomError, match="fathom study run ciresan-sd-quick"):
        load_run_config_or_preset("ciresan-sd-quick")


def test_kind_picks_the_family_member():
    assert validate_config({}).kind == "run"
    assert validate_config({"kind": "depth_scaling", "depths": [4]}).kind == "depth_scaling"
    with pytest.raises(FathomError, match="unknown config kind 'sweep'"):
        validate_config({"kind": "sweep"})
    with pytest.raises(FathomError, match="unknown key 'depths'"):
        validate_config({"kind": "run", "depths": [4]})
    with pytest.raises(FathomError, match="depth 6 is not a positive multiple"):
        validate_config({"kind": "depth_scaling", "depths": [6]})


@pytest.mark.parametrize(
    ("name", "kind"),
    [("ciresan-fast", "run"), ("ciresan-sd-quick", "study"), ("quick", "depth_scaling")],
)
def test_validate_command_accepts_presets_of_every_kind(name, kind, capsys):
    assert main(["validate", name]) == 0
    assert f"valid {kind} config" in capsys.readouterr().out


def test_validate_command_reports_bad_files(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('kind = "depth_scaling"\ndepths = [4]\nlyap_weight = -1\n')
    assert main(["validate", str(bad)]) == 2
    assert "lyap_weight" in capsys.readouterr().err


def test_fidelity_preset_is_the_historical_configuration():
    """Seed 003: raw pixels, ReLU head, the historical per-epoch shrinkage."""
    cfg = load_run_config_or_preset("ciresan-fidelity")
    assert cfg.model.input_scale == 1.0 and cfg.model.output_relu and cfg.model.recipe == "plain"
    assert cfg.optim.schedule.kind == "exponential" and 0 < cfg.optim.schedule.gamma < 1
