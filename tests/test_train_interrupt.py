"""Ctrl-C (SIGINT) during ``fathom train``: the manifest counts only complete epochs, and
``--resume`` ends byte-identical to an uninterrupted run.

An epoch is complete once its boundary is written (history row, checkpoints, resume
state). SIGINT in the middle of an epoch's steps, or in its boundary, leaves a manifest
whose ``epochs_completed`` / ``steps_completed`` are those of the resume state (the point
a resume continues from), never those of the epoch cut short. The deterministic cases use
a ``python``-kind model that signals its own process at a chosen forward
(:mod:`interrupt_models`); one case sends SIGINT from the test, at a moment it cannot
choose within the run. The interrupted runs are real processes, forked from this one
(:mod:`forked`: no fresh interpreter); the uninterrupted reference and the resumes run in
this process (the same thread count).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from done_means_models import write_toml
from fathom.cli import main
from fathom.rundir import RunDir, load_resume
from interrupt_models import ENV, write_features_npz

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 4
if str(ROOT / "tests") not in sys.path:  # the factory's module, as a user's would be
    sys.path.insert(0, str(ROOT / "tests"))


def fathom(forked, args: list[str], sigint: str | None = None):
    """``fathom ARGS`` in a real process (a fork of this one, :mod:`forked`), the SIGINT plan
    of :mod:`interrupt_models` in its environment."""
    return forked(args, env={ENV: sigint, "OMP_NUM_THREADS": "1"})


def finish(proc) -> tuple[int, str]:
    _, err = proc.communicate(timeout=240)
    return proc.returncode, err


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("interrupt")
    npz = write_features_npz(tmp / "features.npz", n=1200)
    config = write_toml(
        tmp / "run.toml",
        {
            "name": "mlp",
            "study": "interrupt",
            "seed": 3,
            "device": "cpu",
            "data": {"dataset": "tensors", "path": str(npz)},
            "model": {"kind": "python", "factory": "interrupt_models:interruptible_mlp"},
            "optim": {"lr": 0.05, "batch_size": 16, "epochs": EPOCHS},
            "eval": {"every": 1},
            "checkpoints": {"save_epochs": [0, 2, EPOCHS]},
            "telemetry": {"enabled": False},
        },
    )
    runs = tmp / "runs"
    assert main(["train", str(config), "--runs-dir", str(runs), "--quiet"]) == 0
    ref = RunDir(runs / "interrupt" / "mlp").manifest
    assert ref["status"] == "complete" and ref["epochs_completed"] == EPOCHS
    return {
        "config": config,
        "runs": runs,
        "final": ref["hashes"]["final_params"],
        "steps": ref["steps_completed"] // EPOCHS,
    }


def check_interrupted(run: Path, rc: int, err: str) -> dict:
    """Exit 130 without a traceback, the command that continues the run printed; the
    manifest says ``interrupted`` and counts what the resume state holds."""
    assert rc == 130, err
    assert "Traceback" not in err
    rd = RunDir(run)
    assert rd.status == "interrupted"
    m = rd.manifest
    assert f"interrupted, {m['epochs_completed']} of {EPOCHS} epochs" in err, err
    assert f"continue with `fathom train --resume {run}`" in err, err
    assert rd.problems() == [], rd.problems()  # every file it lists verifies
    state = load_resume(run / "checkpoints" / "resume.safetensors")
    m = rd.manifest
    assert (m["epochs_completed"], m["steps_completed"]) == (state["epoch"], state["step"])
    assert m["hashes"]["training_order"] == state["order_digest"]
    assert m["hashes"]["masks"] == state["mask_digest"]
    rows = [json.loads(line)["epoch"] for line in (run / "history.jsonl").read_text().splitlines()]
    assert rows[: m["epochs_completed"] + 1] == list(range(m["epochs_completed"] + 1))
    return m


def check_resume(setup: dict, run: Path) -> None:
    """``fathom train --resume`` (in this process) ends with the reference's final hash."""
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    m = RunDir(run).manifest
    assert m["status"] == "complete" and m["epochs_completed"] == EPOCHS
    assert m["hashes"]["final_params"] == setup["final"]
    assert RunDir(run).problems() == []
    epochs = [
        json.loads(line)["epoch"] for line in (run / "history.jsonl").read_text().splitlines()
    ]
    assert epochs == list(range(EPOCHS + 1))


@pytest.mark.parametrize(
    ("where", "plan"),
    [
        ("during a step of epoch 2", lambda steps: f"train:{steps + steps // 2}"),
        ("in the boundary of epoch 2", lambda steps: f"eval:{2 * steps}"),
    ],
)
def test_sigint_inside_an_epoch_counts_only_complete_epochs(setup, forked, where, plan):
    name = "cut-train" if "step" in where else "cut-boundary"
    args = ["train", str(setup["config"]), "--runs-dir", str(setup["runs"]), "--name", name]
    rc, err = finish(fathom(forked, [*args, "--quiet"], sigint=plan(setup["steps"])))
    run = setup["runs"] / "interrupt" / name
    m = check_interrupted(run, rc, err)
    assert m["epochs_completed"] == 1, f"SIGINT {where}: epoch 1 is the last complete one"
    check_resume(setup, run)


def test_sigint_from_another_process(setup, forked):
    args = ["train", str(setup["config"]), "--runs-dir", str(setup["runs"]), "--name", "ext"]
    proc = fathom(forked, [*args, "--quiet"])
    history = setup["runs"] / "interrupt" / "ext" / "history.jsonl"
    deadline = time.monotonic() + 200
    while not (history.exists() and history.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended early"
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    m = check_interrupted(history.parent, rc, err)
    assert m["epochs_completed"] < EPOCHS
    check_resume(setup, history.parent)


def test_sigterm_is_recorded_like_ctrl_c(setup, forked):
    """``kill PID`` (SIGTERM) mid-run: exit 130, ``interrupted`` recorded with the command
    that continues the run, and that command ends with the uninterrupted run's final hash."""
    args = ["train", str(setup["config"]), "--runs-dir", str(setup["runs"]), "--name", "term"]
    proc = fathom(forked, [*args, "--quiet"])
    history = setup["runs"] / "interrupt" / "term" / "history.jsonl"
    deadline = time.monotonic() + 200
    while not (history.exists() and history.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended early"
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    rc, err = finish(proc)
    m = check_interrupted(history.parent, rc, err)
    assert f"--resume {history.parent}" in m["status_reason"]
    check_resume(setup, history.parent)
