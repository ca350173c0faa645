"""``fathom study run``'s live line: the runs a live process trains now, read from their
directories (lock and manifest), drawn on a terminal only."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from rich.console import Console

from fathom.study.watch import StudyWatch, training_line, training_now
from synthetic_runs import synthetic_history, write_run


def study_with_runs(root: Path) -> None:
    """``done`` complete (3 epochs), ``live`` running with 3 of 3 epochs done (its lock held
    by this process, as a sequential study holds it), ``dead`` running with no lock held
    (its writer was killed: interrupted, not training)."""
    rows = synthetic_history(1, [0, 1, 2, 3])
    write_run(root / "done", study="s", recipe="plain", seed=1, lr=0.1, rows=rows)
    for name in ("live", "dead"):
        write_run(
            root / name, study="s", recipe="plain", seed=1, lr=0.1, rows=rows, status="running"
        )
        m = json.loads((root / name / "manifest.json").read_text())
        assert (m["status"], m["epochs_completed"], m["config"]["optim"]["epochs"]) == (
            "running",
            3,
            3,
        )


def test_only_the_runs_a_live_process_holds_are_training(tmp_path: Path):
    from fathom.rundir import DirLock

    study_with_runs(tmp_path)
    with DirLock(tmp_path / "live"):
        assert training_now(tmp_path) == [("live", 3, 3)]
    assert training_now(tmp_path) == []  # released: nothing holds it any more


def test_the_line_names_three_runs_and_counts_the_rest():
    runs = [(f"main-r{i}-s101", i + 1, 10) for i in range(5)]
    assert training_line(runs[:1]) == "training: main-r0-s101 epoch 1/10"
    assert training_line(runs) == (
        "training: main-r0-s101 epoch 1/10, main-r1-s101 epoch 2/10, main-r2-s101 epoch 3/10"
        " +2 more"
    )
    assert training_line([("r", 4, None)]) == "training: r epoch 4"
    assert training_line([]) == ""


def test_the_watch_draws_on_a_terminal_and_stays_silent_in_a_log(tmp_path: Path):
    from fathom.rundir import DirLock

    study_with_runs(tmp_path)
    for terminal in (True, False):
        buf = io.StringIO()
        with DirLock(tmp_path / "live"):
            watch = StudyWatch(
                tmp_path, Console(file=buf, force_terminal=terminal, width=100), every_s=0.01
            ).start()
            time.sleep(0.3)
            watch.stop()
        assert ("training: live epoch 3/3" in buf.getvalue()) == terminal
        assert "dead" not in buf.getvalue() and "done" not in buf.getvalue()
