"""Analyses read exactly the data a run was computed from, from any working directory.

One ``tensors`` run (a user's ``.npz`` named by a relative path, trained from its project
directory) is made once per module. Its analyses (curvature, audit) must: find the data from
another working directory; refuse data whose content changed, the file regenerated with other
values of the same shapes (exit 2, the recorded hash named, nothing written).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from fathom.cli import main
from fathom.errors import FathomError
from fathom.rundir import RunDir

OPTIONS = {"curvature": ["--probe", "32"], "audit": ["--quiet", "--no-router"]}


def write_features(path: Path, seed: int = 0) -> None:
    g = np.random.default_rng(seed)
    np.savez(path, x=g.normal(size=(120, 16)).astype("float32"), y=g.integers(0, 3, 120))


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, Path]:
    """``(template, base)``: a project holding ``features.npz`` and ``runs/default/t``, trained
    from inside it at ``base``, then moved to ``template`` (``base`` names nothing since)."""
    root = tmp_path_factory.mktemp("project")
    base = root / "trained-here"
    base.mkdir()
    write_features(base / "features.npz")
    sets = ["data.dataset=tensors", "data.path=features.npz", "model.widths=[8, 8]"]
    sets += ["optim.epochs=1", "device=cpu", "checkpoints.save_epochs=[0, 1]"]
    args = ["train", "--runs-dir", "runs", "--name", "t", "--quiet"]
    cwd = Path.cwd()
    os.chdir(base)
    try:
        assert main(args + [a for s in sets for a in ("--set", s)]) == 0
    finally:
        os.chdir(cwd)
    return base.rename(root / "template"), base


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """The working directory for the test: an empty directory outside every project."""
    (tmp_path / "elsewhere").mkdir()
    cwd = Path.cwd()
    os.chdir(tmp_path / "elsewhere")
    yield tmp_path / "elsewhere"
    os.chdir(cwd)


@pytest.fixture
def run(template, tmp_path, elsewhere) -> Path:
    """The run of a copy of the template project (its own data file)."""
    copy = shutil.copytree(template[0], tmp_path / "project")
    return copy / "runs" / "default" / "t"


def test_the_run_records_where_its_relative_paths_are_relative_to(template):
    rd = RunDir(template[0] / "runs" / "default" / "t")
    assert rd.config.data.path == "features.npz"  # the config as given (its hash unchanged)
    assert rd.manifest["data"]["info"]["paths_base"] == str(template[1].resolve())


@pytest.mark.parametrize("command", ["curvature", "audit"])
def test_an_analysis_finds_the_data_at_the_recorded_base(template, elsewhere, command):
    shutil.copytree(template[0], template[1])  # back where it was trained
    try:
        assert main([command, str(template[1] / "runs" / "default" / "t"), *OPTIONS[command]]) == 0
    finally:
        shutil.rmtree(template[1])


@pytest.mark.parametrize("command", ["curvature", "audit"])
def test_a_moved_project_is_found_above_the_run_directory(run, command):
    assert main([command, str(run), *OPTIONS[command]]) == 0
    assert (run / command).is_dir()


@pytest.mark.parametrize("command", ["curvature", "audit"])
def test_regenerated_data_of_the_same_shapes_is_refused(run, command, capsys):
    write_features(run.parent.parent.parent / "features.npz", seed=1)  # other values
    assert main([command, str(run), *OPTIONS[command]]) == 2
    err = capsys.readouterr().err
    assert "is not the data it was trained on: data.files recorded" in err
    assert "Restore the original file" in err
    assert not (run / command).exists(), "a refusal writes nothing"


def test_changed_content_is_refused_even_when_the_files_agree(run):
    # the tensors' digest binds the content whatever the files say
    m = RunDir(run).recorded
    from fathom.rundir.inputs import check_recorded_data

    splits = RunDir(run).load_splits()
    splits.fit_y[0] = (splits.fit_y[0] + 1) % 3
    with pytest.raises(FathomError, match="data.tensors_sha256 recorded"):
        check_recorded_data(m, splits, run, RunDir(run).config.data)


def test_a_missing_data_file_names_where_it_was_looked_for(run):
    (run.parent.parent.parent / "features.npz").unlink()
    with pytest.raises(FathomError, match="relative to the directory it was trained from") as e:
        RunDir(run).load_splits()
    assert str(run.parent.parent.parent) in str(e.value)
    assert "run the command from the directory the run was trained in" in str(e.value)


def test_a_resume_from_another_directory_reads_the_recorded_data(template, elsewhere, tmp_path):
    from kill_points import kill_at

    shutil.copytree(template[0], template[1])  # trained there; killed in a second run there
    cwd = Path.cwd()
    try:
        os.chdir(template[1])
        sets = ["data.dataset=tensors", "data.path=features.npz", "model.widths=[8, 8]"]
        sets += ["optim.epochs=2", "device=cpu"]
        args = ["train", "--runs-dir", "runs", "--quiet", *(a for s in sets for a in ("--set", s))]
        with pytest.MonkeyPatch.context() as mp:
            kill_at(mp, "replace", "resume.safetensors", 2)
            with pytest.raises(BaseException, match="killed at replace"):
                main([*args, "--name", "k"])
        assert main([*args, "--name", "whole"]) == 0
        os.chdir(elsewhere)
        run = template[1] / "runs" / "default" / "k"
        assert main(["train", "--resume", str(run), "--quiet"]) == 0
        whole = RunDir(template[1] / "runs" / "default" / "whole").manifest
        assert RunDir(run).manifest["hashes"]["final_params"] == whole["hashes"]["final_params"]
        assert RunDir(run).manifest["data"]["info"]["paths_base"] == str(template[1].resolve())
    finally:
        os.chdir(cwd)
        shutil.rmtree(template[1])
