"""Every shipped preset validates; run presets resolve by name."""

from __future__ import annotations

import pytest

from fathom.errors import FathomError
from fathom.study.config import load_study, preset_names
from fathom.train.cli import load_run_config_or_preset, run_preset_names


@pytest.mark.parametrize("name", preset_names())
def test_study_presets_validate(name):
    _study, origin = load_study(name)
    assert origin == f"preset {name}"


def test_fast_preset_is_the_optimized_baseline():
    assert "ciresan-fast" in run_preset_names()
    cfg = load_run_config_or_preset("ciresan-fast")
    assert cfg.model.recipe == "plain" and cfg.model.unit_dropout > 0
    assert cfg.data.split == "fit-all" and cfg.optim.batch_size == 256
    assert cfg.execution.precision == "bf16" and cfg.stop.target_test_acc == 0.9863
    with pytest.raises(FathomError, match="valid presets: ciresan-fast"):
        load_run_config_or_preset("nope")
