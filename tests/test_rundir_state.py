"""A run's state as every output says it (``fathom.rundir.state``): ``running`` only while a
live process holds the run's lock, ``interrupted`` when recorded or when the writer died
without recording it, and ``running, k of n epochs`` in every output of a run being trained
(terminal lines, report headers, export metadata)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from done_means_models import write_toml
from fathom.cli import main
from fathom.rundir import DirLock, RunDir, lock_holder, run_state
from fathom.rundir.state import RunState
from interrupt_models import write_features_npz

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:  # the factory's module, as a user's would be
    sys.path.insert(0, str(ROOT / "tests"))

EPOCHS = 5000  # never reached: the run is stopped while it trains


def test_sentences_name_the_progress_and_the_command_that_continues() -> None:
    d = Path("runs/s/r")
    running = RunState(d, "running", 3, 10, pid=42)
    assert running.sentence().startswith("running, 3 of 10 epochs (PID 42 is training it")
    interrupted = RunState(d, "interrupted", 3, 10)
    assert interrupted.sentence() == (
        f"interrupted, 3 of 10 epochs: continue with `fathom train --resume {d}`"
    )
    killed = RunState(d, "interrupted", 0, None, killed=True).sentence()
    assert killed.startswith("interrupted, 0 epochs (its process ended without recording it")
    assert RunState(d, "complete", 10, 10).sentence() == "complete, 10 of 10 epochs"
    assert not running.finished and not interrupted.finished
    assert RunState(d, "failed", 2, 10).finished


def _hold(directory: Path, ready: Path) -> None:
    with DirLock(directory):
        ready.write_text("held")
        time.sleep(120)


def test_lock_holder_is_a_live_other_process_only(tmp_path, forked) -> None:
    run = tmp_path / "run"
    assert lock_holder(run) is None  # no directory, no lock file: nothing created
    assert not run.exists()
    with DirLock(run):
        assert lock_holder(run) is None  # this process's own lock is not another holder
    ready = tmp_path / "ready"
    proc = forked(lambda: _hold(run, ready))
    while not ready.exists():
        assert proc.poll() is None, proc.output()
        time.sleep(0.01)
    assert lock_holder(run) == proc.pid
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert lock_holder(run) is None  # the kernel dropped the dead holder's lock
    assert json.loads((run / ".fathom-run.lock").read_text())["pid"] == proc.pid  # stale file


@pytest.fixture
def long_run(tmp_path) -> tuple[Path, Path]:
    """A config of many epochs on a tiny ``tensors`` dataset, and its run directory."""
    npz = write_features_npz(tmp_path / "features.npz", n=96)
    config = write_toml(
        tmp_path / "run.toml",
        {
            "name": "long",
            "study": "states",
            "device": "cpu",
            "data": {"dataset": "tensors", "path": str(npz)},
            "model": {"kind": "python", "factory": "interrupt_models:interruptible_mlp"},
            "optim": {"lr": 0.05, "batch_size": 32, "epochs": EPOCHS},
            "eval": {"every": 1},
            "checkpoints": {"save_epochs": [0]},
        },
    )
    return config, tmp_path / "runs" / "states" / "long"


def _wait_for_rows(proc, history: Path, rows: int) -> None:
    deadline = time.monotonic() + 200
    while not (history.exists() and history.read_text().count("\n") >= rows):
        assert proc.poll() is None and time.monotonic() < deadline, proc.output()
        time.sleep(0.01)


def test_outputs_of_a_run_being_trained_say_running_and_after_a_kill_interrupted(
    long_run, tmp_path, forked, capsys
) -> None:
    config, run = long_run
    proc = forked(["train", str(config), "--runs-dir", str(tmp_path / "runs"), "--quiet"])
    _wait_for_rows(proc, run / "history.jsonl", 3)
    state = run_state(RunDir(run))
    assert (state.status, state.pid, state.epochs) == ("running", proc.pid, EPOCHS)
    # a report and an export elsewhere (the run's own directory is locked by the trainer)
    assert main(["report", str(run), "--out", str(tmp_path / "rep"), "--no-figures"]) == 0
    assert main(["export", str(run), "--to", "jsonl", "--out", str(tmp_path / "exp")]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("not finished: long: running")]
    assert len(lines) == 2 and all(f"of {EPOCHS} epochs (PID {proc.pid}" in x for x in lines)
    assert "1 runs, 0" in out and ", a snapshot: 1 not finished)" in out  # the report line
    assert "verified by reading back 1 runs" in out and "; a snapshot: 1 runs not finished" in out
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert summary.splitlines()[2].startswith("> **Not finished**: long: running, ")
    assert "NOT FINISHED: long: running, " in (tmp_path / "rep" / "report.html").read_text()
    record = json.loads((tmp_path / "exp" / "fathom-export.json").read_text())
    assert record["runs"]["long"]["status"] == "running"
    assert record["runs"]["long"]["state"].startswith("running, ")  # epochs: later than above
    assert record["unfinished"][0].startswith("long: running, ")
    row = json.loads((tmp_path / "exp" / "history.jsonl").read_text().splitlines()[0])
    assert row["run/status"] == "running" and f"of {EPOCHS} epochs" in row["run/state"]

    proc.send_signal(signal.SIGKILL)  # nothing can be recorded: the manifest says running
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert RunDir(run).status == "running"
    state = run_state(RunDir(run))
    assert state.status == "interrupted" and state.killed
    assert main(["report", str(run), "--no-figures"]) == 0
    out = capsys.readouterr().out
    assert f"interrupted, {state.epochs_completed} of {EPOCHS} epochs (its process" in out
    assert f"continue with `fathom train --resume {run}`" in out
    assert "Not finished**: long: interrupted" in (run / "report" / "summary.md").read_text()


def test_a_finished_run_says_only_its_outcome(tmp_path, capsys) -> None:
    """No 'not finished' line for a complete run; its export metadata says complete."""
    npz = write_features_npz(tmp_path / "f.npz", n=48)
    cfg = write_toml(
        tmp_path / "c.toml",
        {
            "name": "done",
            "device": "cpu",
            "data": {"dataset": "tensors", "path": str(npz)},
            "model": {"widths": [8, 8]},
            "optim": {"epochs": 1, "batch_size": 16},
        },
    )
    assert main(["train", str(cfg), "--runs-dir", str(tmp_path / "runs"), "--quiet"]) == 0
    run = tmp_path / "runs" / "default" / "done"
    assert main(["export", str(run), "--to", "jsonl"]) == 0
    assert "not finished" not in capsys.readouterr().out
    record = json.loads((run / "exports" / "jsonl" / "fathom-export.json").read_text())
    assert record["unfinished"] == [] and record["runs"]["done"]["state"] == (
        "complete, 1 of 1 epochs"
    )


def test_a_probe_never_refuses_a_writer_but_a_writer_still_refuses_a_writer(
    tmp_path, monkeypatch
) -> None:
    """A shared probe held for a moment is waited out by a writer taking the lock; a lock
    held for longer than the grace refuses it, naming the holder, as before."""
    import fcntl
    import threading

    from fathom.errors import FathomError
    from fathom.rundir import lock

    run = tmp_path / "run"
    with DirLock(run):
        pass
    fd = os.open(run / lock.RUN_LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # what lock_holder holds while it probes
    monkeypatch.setattr(lock, "PROBE_GRACE_S", 30.0)  # a loaded machine: the probe ends first
    threading.Timer(0.05, fcntl.flock, (fd, fcntl.LOCK_UN)).start()
    with DirLock(run):
        pass
    monkeypatch.setattr(lock, "PROBE_GRACE_S", 0.05)
    fcntl.flock(fd, fcntl.LOCK_SH)  # held past the grace: a holder like any other
    try:
        with pytest.raises(FathomError, match="is locked by another fathom process"):
            DirLock(run).acquire()
    finally:
        os.close(fd)
