"""Backends give the same final-parameter hashes: local sequential, local workers, Ray."""

from __future__ import annotations

import pytest

from fathom.study.backends import LocalBackend, RayBackend
from fathom.study.config import validate_study_config
from fathom.study.runner import run_study
from test_study import synthetic_splits

TINY = {
    "study": {
        "name": "b",
        "reference": "residual",
        "recipes": ["residual", "sd_constant"],
        "seeds": [101, 102],
        "lr": 0.01,
    },
    "tuning": {"enabled": False},
    "base": {
        "device": "cpu",
        "model": {"width_mult": 0.02},
        "optim": {"epochs": 2},
        "checkpoints": {"save_epochs": [0, 2]},
    },
}


def hashes(result) -> dict[str, str]:
    out = {k: v["final_params"] for k, v in result.summary["runs"].items()}
    assert all(out.values()) and len(set(out.values())) == len(out)
    return out


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    study = validate_study_config(TINY, "tiny")
    return hashes(
        run_study(study, tmp_path_factory.mktemp("seq"), LocalBackend(1, 1, synthetic_splits))
    )


def test_two_local_workers_match_sequential(sequential, tmp_path):
    study = validate_study_config(TINY, "tiny")
    result = run_study(study, tmp_path, LocalBackend(2, 1, synthetic_splits))
    assert hashes(result) == sequential


def test_ray_matches_local(sequential, tmp_path):
    try:
        import ray
    except ImportError:
        print("SKIPPED: ray is not installed (pip install -e '.[ray]'); CI installs it")
        pytest.skip("ray is not installed: pip install -e '.[ray]' (CI installs it)")
    import test_study

    ray.cloudpickle.register_pickle_by_value(test_study)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        study = validate_study_config(TINY, "tiny")
        result = run_study(study, tmp_path, RayBackend(None, 1, synthetic_splits))
    finally:
        ray.shutdown()
    assert hashes(result) == sequential
    assert "ray" in result.summary["execution"]["backend"]
