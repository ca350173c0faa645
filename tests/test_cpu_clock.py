"""The CPU training clock: ``clock/training_cpu_s`` beside the wall training clock."""

from __future__ import annotations

import time

import torch

from conftest import tiny_config
from fathom.rundir import RunDir
from fathom.telemetry import field_for
from fathom.train.loop import train
from fathom.train.state import Clocks, Progress
from fathom.train.steppers import run_timed

torch.set_num_threads(1)


class _Stepper:
    """A stand-in stepper whose epoch either burns CPU or sleeps for ``seconds``."""

    def __init__(self, seconds: float, busy: bool) -> None:
        self.seconds, self.busy = seconds, busy

    def run_epoch(self, plan) -> torch.Tensor:
        end = time.perf_counter() + self.seconds
        if not self.busy:
            time.sleep(self.seconds)
        while self.busy and time.perf_counter() < end:
            pass
        return torch.zeros((), dtype=torch.float64)


def test_run_timed_counts_cpu_work_not_waiting():
    clocks = Clocks()
    run_timed(_Stepper(0.2, busy=False), None, clocks)
    assert clocks.training_cpu_s < 0.05, "sleeping is waiting, not the training thread's work"
    slept = clocks.training_cpu_s
    t0 = time.perf_counter()
    run_timed(_Stepper(0.1, busy=True), None, clocks)
    wall = time.perf_counter() - t0
    busy = clocks.training_cpu_s - slept
    assert 0.0 < busy <= wall, "one thread's CPU time never exceeds the wall time it ran in"
    assert clocks.training_s == 0.0, "run_timed keeps the wall training clock to the loop"


def test_history_and_manifest_carry_the_cpu_clock(tmp_path, splits):
    res = train(tiny_config(**{"model.recipe": "sd_constant"}), tmp_path / "r", splits=splits)
    rd = RunDir(res.run_dir)
    rows = rd.history()
    cpu = [r["clock/training_cpu_s"] for r in rows]
    wall = [r["clock/training_s"] for r in rows]
    assert cpu[0] == 0.0 and wall[0] == 0.0, "epoch 0 is before any step"
    for a, b, wa, wb in zip(cpu, cpu[1:], wall, wall[1:], strict=False):
        assert b > a, "every epoch's steps take some CPU time"
        assert b - a <= (wb - wa) + 1e-4, "the CPU interval lies inside the wall interval"
    clocks = rd.manifest["clocks"]
    assert clocks["training_cpu_s"] == cpu[-1]
    assert clocks["training_s"] == wall[-1]
    assert field_for("clock/training_cpu_s").units == "s"


def test_resume_state_without_the_cpu_clock_still_loads():
    state = Progress(clocks=Clocks(training_s=2.0, training_cpu_s=1.5)).to_state()
    assert Progress.from_state(state).clocks.training_cpu_s == 1.5
    del state["clocks"]["training_cpu_s"]  # a resume state written before the clock existed
    restored = Progress.from_state(state)
    assert restored.clocks.training_s == 2.0 and restored.clocks.training_cpu_s == 0.0
