"""Analysis outputs (and exports) are written under the lock of the directory they live in
(``fathom.rundir.output.analysis_output``).

A second process holding a run's lock (as ``fathom train`` does) or a study's lock (as
``fathom study run`` does) makes ``fathom curvature`` / ``audit`` / ``report`` refuse at once,
naming that PID, with nothing written; two analyses of one run cannot interleave their files;
a trainer cannot start while an analysis writes into its run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import synthetic_splits, tree_digest
from fathom.cli import main
from fathom.errors import FathomError
from fathom.rundir import RunDir, RunWriter
from fathom.rundir.lock import RUN_LOCK, STUDY_LOCK
from fathom.rundir.output import OUTPUT_LOCK, analysis_output

SRC = Path(__file__).resolve().parents[1] / "src"
HOLD = (
    "import sys, time\n"
    "from fathom.rundir.lock import DirLock\n"
    "lock = DirLock(sys.argv[1], name=sys.argv[2]).acquire()\n"
    "print('locked', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def holder() -> Iterator:
    """``hold(directory, lock_name)``: a live child process holding that lock (killed after)."""
    procs: list[subprocess.Popen] = []

    def hold(directory: Path, name: str) -> int:
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(directory), name],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        return proc.pid

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


COMMANDS = {
    "curvature": ["curvature", "{}", "--epochs", "0", "--probe", "4"],
    "audit": ["audit", "{}", "--quiet", "--no-router"],
    "report": ["report", "{}", "--no-figures"],
    "export": ["export", "{}", "--to", "jsonl"],
}


def _cli(name: str, target: Path) -> list[str]:
    return [str(target) if a == "{}" else a for a in COMMANDS[name]]


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` but the lock files (their holder record is the holder's)."""
    locks = {RUN_LOCK, STUDY_LOCK, OUTPUT_LOCK}
    return {k: v for k, v in tree_digest(root).items() if Path(k).name not in locks}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_analysis_of_a_run_a_trainer_holds_is_refused_naming_its_pid(
    tiny_run_copy, holder, capsys, command
):
    pid = holder(tiny_run_copy, RUN_LOCK)  # what `fathom train` / `--resume` holds
    before = _tree(tiny_run_copy)
    assert main(_cli(command, tiny_run_copy)) == 2
    err = capsys.readouterr().err
    assert f"PID {pid}" in err and "Nothing was written" in err, err
    assert _tree(tiny_run_copy) == before  # no output directory, no file, nothing changed
    assert not (tiny_run_copy / command).exists() and not (tiny_run_copy / "exports").exists()


@pytest.mark.parametrize("command", ["audit", "report", "export"])
def test_an_analysis_of_a_study_a_study_run_holds_is_refused_naming_its_pid(
    tiny_run_copy, holder, capsys, command
):
    study = tiny_run_copy.parent  # the copy's parent is a study directory holding one run
    pid = holder(study, STUDY_LOCK)  # what `fathom study run` holds
    before = _tree(study)
    assert main(_cli(command, study)) == 2
    assert f"PID {pid}" in capsys.readouterr().err
    assert _tree(study) == before and not (study / command).exists()
    assert not (study / "exports").exists()


def test_two_analyses_of_one_run_cannot_interleave_and_a_trainer_waits_for_them(
    tiny_run_copy, capsys
):
    with analysis_output(tiny_run_copy, "curvature") as out:
        out.json("epoch-0000.json", {"partial": True})
        assert main(_cli("curvature", tiny_run_copy)) == 2  # a second analysis of the run
        assert f"PID {os.getpid()}" in capsys.readouterr().err
        assert main(_cli("audit", tiny_run_copy)) == 2  # another kind, same run directory
        with pytest.raises(FathomError, match=f"PID {os.getpid()}"):
            RunWriter(tiny_run_copy).acquire()  # a trainer (train, --resume) is refused too
        assert sorted(p.name for p in (tiny_run_copy / "curvature").iterdir()) == [
            "epoch-0000.json"
        ]
    from fathom.curvature.rundir import run_curvature

    class TinyRun(RunDir):  # trained on data given in memory: given again
        def load_splits(self, device="cpu"):
            return synthetic_splits()

    run_curvature(TinyRun(tiny_run_copy), [0], probe=4)  # released: the analysis runs
    written = sorted(p.name for p in (tiny_run_copy / "curvature").iterdir())
    assert written == ["epoch-0000.json", "summary.json", "summary.md"]
    assert "partial" not in (tiny_run_copy / "curvature" / "epoch-0000.json").read_text()
    RunWriter(tiny_run_copy).acquire().close()


def test_an_output_elsewhere_has_its_own_lock_and_a_failed_block_releases(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    (tmp_path / "other").mkdir()
    with analysis_output(run, "audit", tmp_path / "out") as out:
        with (
            pytest.raises(FathomError, match="output directory .* is locked"),
            analysis_output(tmp_path / "other", "report", tmp_path / "out"),
        ):
            pass
        with analysis_output(run, "curvature"):  # another directory, another lock
            pass
    with pytest.raises(RuntimeError), analysis_output(run, "audit", tmp_path / "out"):
        raise RuntimeError("an analysis failed")
    with analysis_output(run, "audit", tmp_path / "out") as out:  # released by the failure
        out.text("a.md", "x")
    with pytest.raises(FathomError, match="is closed"):
        out.text("b.md", "y")  # a write after the block has no lock
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [OUTPUT_LOCK, "a.md"]


def test_an_output_file_must_stay_inside_its_directory_and_a_target_must_exist(tmp_path):
    with analysis_output(tmp_path, "report") as out:
        with pytest.raises(FathomError, match="outside"):
            out.json("../escape.json", {})
        out.json("figures/deep.json", {"ok": 1})  # subdirectories are fine
    assert not (tmp_path / "escape.json").exists()
    with (
        pytest.raises(FathomError, match="not a directory"),
        analysis_output(tmp_path / "nowhere", "report"),
    ):
        pass
    assert not (tmp_path / "nowhere").exists()
