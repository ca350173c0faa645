"""Every config Fathom writes reads back: to the same config and the same ``config_hash``.

What is written: a run's ``manifest.json`` ``config`` (``RunConfig.model_dump(mode="json")``),
a study's ``study.json`` (:mod:`fathom.study.studyfile`) and a depth-scaling benchmark's
``benchmark.json``; every shipped preset of every kind. The configs are generated from the
pydantic models' own fields (``tests/config_strategies.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from config_strategies import HINTS, model_data
from fathom.base.io import config_digest
from fathom.config import RunConfig, validate_run_config
from fathom.config.recipes import RECIPES
from fathom.depthscale.config import DepthScaleConfig, validate_depth_scaling
from fathom.errors import FathomError
from fathom.models.prep import NORMALIZATION
from fathom.study.config import STUDY_OWNED_KEYS, StudyConfig, validate_study_config
from fathom.study.family import load_config, preset_names, validate_config
from fathom.study.studyfile import STUDY_FILE, read_study_file, study_file_data, write_study_file

HINTS.update(
    {
        "StudySection.recipes": st.lists(
            st.sampled_from(sorted(RECIPES)), min_size=1, max_size=3, unique=True
        ),
        "StudySection.reference": st.sampled_from(sorted(RECIPES)[:2]),
        "TuningSection.lr": st.dictionaries(
            st.sampled_from(sorted(RECIPES)), st.floats(1e-4, 1.0), max_size=3
        ),
        "DepthScaleConfig.dataset": st.sampled_from(sorted(NORMALIZATION)),
        "DepthScaleConfig.depths": st.lists(
            st.sampled_from([4, 8, 12, 16]), min_size=1, max_size=3
        ),
    }
)
PROPERTY = settings(
    max_examples=60, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow]
)


def _valid(data: dict, validate):
    try:
        return validate(data)
    except FathomError:
        assume(False)


def _through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))


def _study_data() -> st.SearchStrategy[dict]:
    def drop_owned(d: dict) -> dict:
        base = d.get("base")
        if isinstance(base, dict):
            for key in STUDY_OWNED_KEYS:
                *parents, last = key.split(".")
                node = base
                for p in parents:
                    node = node.get(p) if isinstance(node, dict) else None
                if isinstance(node, dict):
                    node.pop(last, None)
        return d

    return model_data(StudyConfig).map(drop_owned)


def check_run_roundtrip(cfg: RunConfig) -> None:
    written = _through_json(cfg.model_dump(mode="json"))  # the manifest's "config"
    back = validate_run_config(written, origin="manifest")
    assert back.model_dump(mode="json") == written
    assert config_digest(back.model_dump(mode="json")) == config_digest(cfg.model_dump(mode="json"))
    assert back == cfg.model_copy(update={"live": back.live})


def check_study_roundtrip(study: StudyConfig, tmp: Path) -> None:
    write_study_file(tmp, study, origin="test")
    stored = json.loads((tmp / STUDY_FILE).read_text())
    back = read_study_file(tmp)
    assert back.to_data() == study.to_data() == stored["config"]
    assert config_digest(back.to_data()) == stored["config_hash"]
    assert back.lr_source() == study.lr_source() and back.fixed_lrs() == study.fixed_lrs()
    assert back.tuning.runs_grid == study.tuning.runs_grid


def check_depth_roundtrip(cfg: DepthScaleConfig) -> None:
    written = _through_json({"kind": "depth_scaling", "config": cfg.model_dump()})  # benchmark.json
    back = validate_depth_scaling(written["config"], origin="benchmark.json")
    assert back == cfg and config_digest(back.model_dump()) == config_digest(cfg.model_dump())


@PROPERTY
@given(model_data(RunConfig))
def test_generated_run_configs_read_back(data: dict) -> None:
    check_run_roundtrip(_valid(data, validate_run_config))


@PROPERTY
@given(_study_data())
@example(
    {
        "study": {"name": "frozen", "reference": "residual", "recipes": ["residual"], "seeds": [1]},
        "tuning": {"mode": "frozen", "lr": {"residual": 0.01}},
    }
)
@example(  # found by the property: to_data() raised KeyError 'recipe' (now refused up front)
    {
        "study": {"name": "0", "reference": "plain", "recipes": ["plain"]},
        "base": {"model": {"kind": "staged_conv"}},
    }
)
def test_generated_study_configs_read_back(tmp_path_factory, data: dict) -> None:
    study = _valid(data, validate_study_config)
    check_study_roundtrip(study, tmp_path_factory.mktemp("study"))


@PROPERTY
@given(model_data(DepthScaleConfig))
def test_generated_depth_scaling_configs_read_back(data: dict) -> None:
    check_depth_roundtrip(_valid(data, validate_depth_scaling))


@pytest.mark.parametrize("name", [n for names in preset_names().values() for n in names], ids=str)
def test_every_preset_reads_back(name: str, tmp_path: Path) -> None:
    cfg, _ = load_config(name)
    if isinstance(cfg, RunConfig):
        check_run_roundtrip(cfg)
    elif isinstance(cfg, StudyConfig):
        check_study_roundtrip(cfg, tmp_path)
        check_run_roundtrip(cfg.base)
    else:
        check_depth_roundtrip(cfg)
    written = cfg.to_data() if isinstance(cfg, StudyConfig) else cfg.model_dump(mode="json")
    back = validate_config(_through_json(written))
    assert back == (
        cfg if isinstance(cfg, DepthScaleConfig) else cfg.model_copy(update={"live": back.live})
    )


def test_a_study_of_another_model_kind_is_refused_naming_the_fix() -> None:
    data = {
        "study": {"name": "s", "reference": "plain", "recipes": ["plain"], "lr": 0.1},
        "base": {"model": {"kind": "staged_conv"}},
    }
    with pytest.raises(FathomError, match="use kind 'ciresan' in a study"):
        validate_study_config(data)


def test_frozen_study_is_written_disabled_and_refuses_enabled_input(tmp_path: Path) -> None:
    study, _ = load_config("ciresan-seed-003-quick")
    assert study.tuning.mode == "frozen" and study.tuning.enabled is False
    assert study_file_data(study, "x")["config"]["tuning"]["enabled"] is False
    data = study.to_data()
    data["tuning"]["enabled"] = True  # what the user asks: a grid and frozen rates at once
    with pytest.raises(FathomError, match="runs no tuning, but tuning.enabled = true"):
        validate_study_config(data)


def test_a_frozen_study_file_of_older_fathom_reads_as_its_frozen_study(tmp_path: Path) -> None:
    """study.json files written before the fix hold ``enabled = true`` beside ``frozen``."""
    study, _ = load_config("ciresan-seed-003-quick")
    legacy = study_file_data(study, "preset")
    legacy["config"]["tuning"]["enabled"] = True
    (tmp_path / STUDY_FILE).write_text(json.dumps(legacy))
    back = read_study_file(tmp_path)
    assert back.to_data() == study.to_data() and back.lr_source() == "frozen"


DEMO = Path("/tmp/anchor0/ciresan-seed-003-quick")


def test_study_status_reads_the_demo_study(tmp_path: Path, capsys) -> None:
    """``fathom study status`` on a frozen study directory (the demo's, when present here;
    else one made by writing the preset's study.json) exits 0 and lists every main run."""
    from fathom.cli import main

    root = tmp_path / "ciresan-seed-003-quick"
    if (DEMO / STUDY_FILE).exists():
        root.mkdir()
        shutil.copy(DEMO / STUDY_FILE, root / STUDY_FILE)
    else:
        study, _ = load_config("ciresan-seed-003-quick")
        root.mkdir()
        legacy = study_file_data(study, "preset")
        legacy["config"]["tuning"]["enabled"] = True
        (root / STUDY_FILE).write_text(json.dumps(legacy))
    assert main(["study", "status", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count("main-") == 15 and "not started" in out


def test_a_frozen_study_reruns_over_its_own_older_study_file(tmp_path: Path) -> None:
    """``fathom study run`` again on a frozen study whose study.json an older Fathom wrote
    (``enabled = true`` beside ``frozen``): accepted, complete runs skipped."""
    from fathom.study.runner import run_study
    from test_study import local, study_data

    data = study_data(
        study={"recipes": ["residual"], "seeds": [101]},
        tuning={"mode": "frozen", "lr": {"residual": 0.05}},
    )
    data["tuning"].pop("enabled")
    study = validate_study_config(data)
    first = run_study(study, tmp_path, local())
    stored = json.loads((first.root / STUDY_FILE).read_text())
    assert stored["config"]["tuning"]["enabled"] is False
    stored["config"]["tuning"]["enabled"] = True  # what older Fathom wrote
    (first.root / STUDY_FILE).write_text(json.dumps(stored))
    again = run_study(study, tmp_path, local())
    assert [o.action for o in again.outcomes] == ["skipped"]
    assert read_study_file(first.root).to_data() == study.to_data()
