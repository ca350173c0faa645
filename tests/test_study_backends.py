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


#: one run of TINY (its run id and config are TINY's): what a Ray task or a submitit job
#: array of one task needs to prove the path, each being a fresh Python process (torch import)
ONE_RUN = {**TINY, "study": {**TINY["study"], "recipes": ["residual"], "seeds": [102]}}


def test_ray_matches_local(sequential, tmp_path):
    """One run of the study as a Ray task (a Ray worker process, as on a cluster) ends with
    the local backend's final hash; one run is the whole path (task, wait, registry row)."""
    try:
        import ray
    except ImportError:
        print("SKIPPED: ray is not installed (pip install -e '.[ray]'); CI installs it")
        pytest.skip("ray is not installed: pip install -e '.[ray]' (CI installs it)")
    import test_study

    ray.cloudpickle.register_pickle_by_value(test_study)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        study = validate_study_config(ONE_RUN, "tiny")
        result = run_study(study, tmp_path, RayBackend(None, 1, synthetic_splits))
    finally:
        ray.shutdown()
    got = hashes(result)
    assert len(got) == 1 and got == {run: sequential[run] for run in got}
    assert "ray" in result.summary["execution"]["backend"]


def test_two_local_workers_match_sequential(sequential, tmp_path):
    study = validate_study_config(TINY, "tiny")
    result = run_study(study, tmp_path, LocalBackend(2, 1, synthetic_splits))
    assert hashes(result) == sequential


def test_worker_device_mapping_with_a_faked_device_count(monkeypatch):
    """Each local worker takes its own CUDA device (round-robin when fewer GPUs than workers)."""
    import queue

    import torch

    from fathom.errors import FathomError
    from fathom.study.backends import wants_cuda
    from fathom.study.pool import init_worker_device, worker_devices

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert worker_devices(4) == [0, 1, 2, 3]
    assert worker_devices(6) == [0, 1, 2, 3, 0, 1]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert worker_devices(3) == [0, 0, 0]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(FathomError, match="no CUDA device is visible"):
        worker_devices(2)

    # the pool initializer: each worker process takes the next index and makes it current
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    indices: queue.Queue = queue.Queue()
    for i in worker_devices(3):
        indices.put(i)
    for _ in range(3):
        init_worker_device(indices)
    assert chosen == [0, 1, 2]
    indices.put(None)
    init_worker_device(indices)  # a CPU study: the device is left alone
    assert chosen == [0, 1, 2]

    # which studies get devices: GPU runs only
    from fathom.study.config import validate_study_config
    from fathom.study.plan import main_specs

    cpu = validate_study_config(TINY, "tiny")
    specs = main_specs(cpu, "runs", cpu.fixed_lrs())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not wants_cuda(specs)  # device = "cpu" in the config
    auto = validate_study_config({**TINY, "base": {**TINY["base"], "device": "auto"}}, "auto")
    assert wants_cuda(main_specs(auto, "runs", auto.fixed_lrs()))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not wants_cuda(main_specs(auto, "runs", auto.fixed_lrs()))


@pytest.mark.parametrize("cluster", ["local", "debug"])
def test_slurm_backend_through_submitit_matches_local(sequential, tmp_path, cluster):
    """submitit's LocalExecutor (a subprocess per run, as a Slurm task would be) and its
    DebugExecutor (in process) give the local backend's final hashes. The local executor
    runs one run of the study (each task pays a fresh interpreter), the debug one all four."""
    try:
        import cloudpickle
        import submitit  # noqa: F401
    except ImportError:
        print("SKIPPED: submitit is not installed (pip install -e '.[slurm]'); CI installs it")
        pytest.skip("submitit is not installed: pip install -e '.[slurm]' (CI installs it)")
    import test_study
    from fathom.study.slurm import SlurmBackend

    cloudpickle.register_pickle_by_value(test_study)
    backend = SlurmBackend(
        folder=str(tmp_path / "submitit"), cluster=cluster, threads=1, splits_for=synthetic_splits
    )
    study = validate_study_config(ONE_RUN if cluster == "local" else TINY, "tiny")
    result = run_study(study, tmp_path, backend)
    got = hashes(result)
    assert len(got) == (1 if cluster == "local" else 4)
    assert got == {run: sequential[run] for run in got}
    assert "slurm via submitit" in result.summary["execution"]["backend"]
    again = run_study(study, tmp_path, backend)  # resumable like every backend: all skipped
    assert {o.action for o in again.outcomes} == {"skipped"}


def test_missing_submitit_names_the_install(monkeypatch):
    import sys

    from fathom.errors import FathomError
    from fathom.study.backends import make_backend

    monkeypatch.setitem(sys.modules, "submitit", None)
    backend = make_backend("slurm", slurm={"folder": "unused"})
    with pytest.raises(FathomError, match=r"pip install -e '\.\[slurm\]'"):
        backend.run([object()], retry_failed=False, registry_file=None)


# -- the backends are one table ------------------------------------------------------------
def test_every_row_builds_its_backend(tmp_path):
    from fathom.study.backends import BACKENDS, make_backend

    for name, row in BACKENDS.items():
        backend = make_backend(name, threads=3, slurm={"folder": str(tmp_path)})
        assert type(backend).__name__ == row.cls.rsplit(":", 1)[1]
        assert backend.name.startswith(name) and backend.threads == 3


def test_an_unknown_backend_is_refused_with_the_known_ones():
    from fathom.errors import FathomError
    from fathom.study.backends import make_backend

    with pytest.raises(FathomError, match=r"unknown backend 'rey'.*did you mean 'ray'") as e:
        make_backend("rey")
    assert str(e.value).endswith("choose one of local, ray, slurm")


@pytest.mark.parametrize("command", ["study", "reproduce"])
def test_the_commands_offer_the_tables_backends_and_refuse_another_backends_option(command):
    import argparse

    from fathom.errors import FathomError
    from fathom.study.backends import BACKENDS
    from fathom.study.cli import check_backend_options

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    if command == "study":
        from fathom.study.cli import add_parser
    else:
        from fathom.reproduce.cli import add_parser
    add_parser(sub)
    run = next(iter(sub.choices.values()))
    if command == "study":  # study run is a subcommand of study
        run = next(a for a in run._actions if isinstance(a, argparse._SubParsersAction)).choices[
            "run"
        ]
    backend = next(a for a in run._actions if a.dest == "backend")
    assert backend.choices == list(BACKENDS) and backend.default == "local"
    for name, row in BACKENDS.items():
        for option in row.options:
            other = next(n for n in BACKENDS if n != name)
            args = run.parse_args(["x", "--backend", other, option, "1"])
            with pytest.raises(FathomError, match=f"{option} is for --backend {name}"):
                check_backend_options(args)
            check_backend_options(run.parse_args(["x", "--backend", name, option, "1"]))
