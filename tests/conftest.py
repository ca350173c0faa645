"""Shared fixtures: tiny synthetic splits and tiny run configs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    import torch

    from fathom.config import RunConfig
    from fathom.data import DataSplits

pytest_plugins = ["cpu_clock"]


def pytest_sessionstart(session: pytest.Session) -> None:
    """One intra-op thread in every process that runs tests. The pytest-xdist controller runs
    none and never imports torch: its start-up (2 s of torch, pydantic and Fathom imports)
    would delay the workers' (this module imports them in its fixtures and helpers)."""
    if not session.config.pluginmanager.hasplugin("dsession"):
        import torch

        torch.set_num_threads(1)


# -- the order files reach the two xdist workers ----------------------------------------------
HEAVIEST_FILES_FIRST = (
    "test_study_backends.py",
    "test_seam_generated.py",
    "test_study_integrity.py",
    "test_reproduce.py",
    "test_depthscale_run.py",
    "test_report_browser.py",
    "test_reproduce_depth.py",
    "test_curvature_estimate_losses.py",
    "test_resume_integrity.py",
    "test_study_damage.py",
    "test_train_kinds.py",
    "test_cli_errors.py",
    "test_config_roundtrip.py",
    "test_cli.py",
    "test_integrations.py",
    "test_train.py",
    "test_curvature_estimate.py",
    "test_export.py",
    "test_depth_probs.py",
    "test_study.py",
    "test_stats_scaling.py",
    "test_train_gpt.py",
    "test_curvature_language.py",
    "test_rundir.py",
    "test_train_sigint_anywhere.py",
    "test_report_lm.py",
    "test_losses_labels.py",
    "test_train_steps.py",
    "test_done_means.py",
    "test_instruments.py",
    "test_export_dashboards.py",
    "test_depthscale_lm.py",
    "test_report.py",
    "test_resume_damage.py",
    "test_data_real.py",
    "test_structure.py",
    "test_seam_identity.py",
)
"""Test files by the seconds their tests took in one ``--junitxml`` run of the suite (the sum of
each file's test times, 2026-12-06, after the batched Hutchinson probes and scipy.special),
the costliest first. ``--dist loadfile`` hands each worker one whole file at a time in
collection order; the heaviest files first and the many light ones last
(longest-processing-time-first) leaves the two workers a short, even tail. A file missing
from the tuple only runs after those in it; a stale order costs time, never a test."""


def pytest_configure(config: pytest.Config) -> None:
    """Under ``--dist loadfile`` the xdist controller takes the files in collection order
    (:data:`HEAVIEST_FILES_FIRST`) rather than by their number of tests, its default, which
    sent the costliest files (few, slow tests) last and left one worker running them alone."""
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: the files of :data:`HEAVIEST_FILES_FIRST` first, in its order, then
    the rest in their usual order; the tests within a file keep theirs (a stable sort). A run
    without ``-n`` keeps the usual order."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: i for i, name in enumerate(HEAVIEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True, scope="module")
def no_wandb_thread_outlives_its_module() -> Iterator[None]:
    """W&B keeps a service thread and an asyncio thread after its runs finish; they end with
    the test module that started them, so a later test never forks a process that has them (a
    fork copies every lock as it is, and one such a thread held then stays held in the child;
    ``tests/forked.py`` forks this process)."""
    yield
    import sys

    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


# Properties run under a fixed-seed profile in CI and by default (same examples every run, so a
# red run is reproducible); FATHOM_HYPOTHESIS=long explores far more. Each test states its own
# max_examples for the default profile; every counter-example found is kept as a named test.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("FATHOM_HYPOTHESIS", "ci"))

TINY_WIDTHS = (32, 24, 16, 12, 8)


def synthetic_splits(
    n_fit: int = 256, n_eval: int = 128, seed: int = 0, classes: int = 10
) -> DataSplits:
    """Learnable synthetic 'images': class-dependent mean intensity pattern plus noise, uint8."""
    import torch

    from fathom.data import DataSplits

    g = torch.Generator().manual_seed(seed)
    protos = torch.rand(classes, 784, generator=g) * 200

    def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, classes, (n,), generator=g)
        x = (protos[y] + torch.rand(n, 784, generator=g) * 55).clamp(0, 255).to(torch.uint8)
        return x.reshape(n, 28, 28), y

    fx, fy = make(n_fit)
    vx, vy = make(n_eval)
    tx, ty = make(n_eval)
    return DataSplits(
        fx,
        fy,
        vx,
        vy,
        tx,
        ty,
        split_hash=f"synthetic-{seed}-{n_fit}-{n_eval}",
        info={"dataset": "synthetic", "classes": classes, "sizes": {"fit": n_fit}},
    )


def tiny_config(**updates) -> RunConfig:
    from fathom.config import RunConfig

    base = RunConfig(name="tiny", study="test")
    upd = {
        "model.widths": list(TINY_WIDTHS),
        "optim.epochs": 3,
        "optim.batch_size": 32,
        "optim.lr": 0.05,
        "eval.every": 1,
        "device": "cpu",
    }
    epochs = updates.get("optim.epochs", upd["optim.epochs"])
    upd["checkpoints.save_epochs"] = [e for e in (0, 1, 2, 3) if e <= epochs]  # within training
    upd.update(updates)
    return base.with_updates(upd)


@pytest.fixture(scope="module")
def needs_sklearn() -> None:
    """Skip a module whose tests need scikit-learn (the ``audit`` extra) where it is missing:
    imported when the first test runs, not when the file is collected (a module-level
    ``importorskip`` cost every xdist worker 1.3 s of collection)."""
    pytest.importorskip("sklearn")


@pytest.fixture
def splits() -> DataSplits:
    return synthetic_splits()


# -- one trained tiny run per session (per xdist worker), shared read-only -------------------
def tree_digest(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, by relative path."""
    from fathom.base.io import sha256_file

    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="session")
def shared_tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_config()`` trained once on ``synthetic_splits()`` (the ``splits`` fixture's data).

    Use it through ``trained_tiny_run`` (read-only, checked) or ``tiny_run_copy`` (yours)."""
    from fathom.train.loop import train

    res = train(
        tiny_config(), tmp_path_factory.mktemp("shared") / "tiny", splits=synthetic_splits()
    )
    assert res.status == "complete", res.status
    return res.run_dir


@pytest.fixture
def trained_tiny_run(shared_tiny_run: Path) -> Iterator[Path]:
    """The session's tiny run, read-only: a test that changes, adds or removes a file under it
    fails at teardown (a test that must modify a run takes ``tiny_run_copy``)."""
    before = tree_digest(shared_tiny_run)
    yield shared_tiny_run
    if tree_digest(shared_tiny_run) != before:
        pytest.fail(f"the shared run {shared_tiny_run} was modified: use tiny_run_copy")


@pytest.fixture
def tiny_run_copy(shared_tiny_run: Path, tmp_path: Path) -> Path:
    """A private copy of the session's tiny run (``tmp_path / "run"``), free to modify."""
    return Path(shutil.copytree(shared_tiny_run, tmp_path / "run"))


@pytest.fixture
def forked() -> Iterator:
    """``forked(argv, env=..., new_session=...)`` runs ``fathom ARGV`` in a forked child of
    this process (:mod:`forked`: a real process, no torch import); ``forked(callable)`` runs
    any function there. Children still running at teardown are killed and reaped."""
    from forked import Forked, fork_cli

    started: list[Forked] = []

    def start(what, **kw) -> Forked:
        proc = Forked(what, **kw) if callable(what) else fork_cli(what, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()


def encode_idx(values: torch.Tensor) -> bytes:
    """Serialise a tensor as IDX bytes (the inverse of :func:`fathom.data.idx.parse_idx`);
    refuses a dtype IDX has no code for."""
    import numpy as np

    from fathom.data.idx import IDX_DTYPES
    from fathom.errors import FathomError

    array = values.detach().cpu().numpy()
    code = next(
        (c for c, d in IDX_DTYPES.items() if d.newbyteorder("=") == array.dtype.newbyteorder("=")),
        None,
    )
    if code is None:
        raise FathomError(
            f"dtype {array.dtype} has no IDX code; use uint8, int8, int16, int32, float32 or float64."
        )
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + array.astype(IDX_DTYPES[code], copy=False).tobytes()
