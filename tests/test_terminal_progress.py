"""Progress displays (``fathom.base.terminal``): throttled live line on a terminal, one line per
epoch elsewhere, k/N with ETA for studies; training numerics unchanged with progress on."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from conftest import synthetic_splits, tiny_config
from fathom.base.terminal import REDRAWS_PER_S, Tally, TrainProgress, eta_s, fmt_duration


class Clock:
    """A hand-advanced monotonic clock."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def feed(p: TrainProgress, clock: Clock, epochs: int, steps: int, dt: float) -> None:
    """What the trainer sends: the epoch-0 row, then per epoch its steps, row and end."""
    p("epoch", {"epoch": 0, "step": 0, "val/acc": 0.1, "val/ce": 2.3, "test/acc": 0.1})
    for epoch in range(1, epochs + 1):
        for i in range(steps):
            p("step", {"epoch": epoch, "epochs": epochs, "step": i, "steps": steps})
            clock.t += dt
        row = {"epoch": epoch, "step": epoch * steps, "val/acc": 0.9, "val/ce": 0.3}
        p("epoch", row | {"test/acc": 0.91, "train/loss_running": 0.5})
        end = {"epoch": epoch, "epochs": epochs, "step": epoch * steps}
        p("epoch_end", end | {"train/loss_running": 0.5, "clock/training_s": epoch * steps * dt})
    p.close()


def test_off_a_terminal_one_line_per_epoch():
    buf = io.StringIO()
    clock = Clock()
    p = TrainProgress(Console(file=buf, force_terminal=False, width=80), clock=clock)
    feed(p, clock, epochs=3, steps=500, dt=0.002)
    lines = buf.getvalue().splitlines()
    assert p.redraws == 0 and "\x1b" not in buf.getvalue()
    assert len(lines) == 4, lines  # epoch 0 (before training), then one per epoch
    assert lines[0].startswith("epoch 0 ") and "val acc 10.00%" in lines[0]
    for epoch, line in enumerate(lines[1:], 1):
        assert line.startswith(f"epoch {epoch}/3 step {epoch * 500}  loss 0.5000"), line
        assert "val acc 90.00%" in line and "test acc 91.00%" in line
        assert "500.0 steps/s" in line  # 500 steps / 1.0 s of training clock


def test_on_a_terminal_rate_and_eta_within_the_redraw_throttle():
    buf = io.StringIO()
    clock = Clock()
    p = TrainProgress(Console(file=buf, force_terminal=True, width=120), clock=clock)
    epochs, steps, dt = 2, 1000, 0.002  # 2 s per epoch, 4 s in all
    feed(p, clock, epochs=epochs, steps=steps, dt=dt)
    out = buf.getvalue()
    duration = epochs * steps * dt
    assert 4 <= p.redraws <= REDRAWS_PER_S * duration + 1, p.redraws
    assert "500.0 steps/s" in out  # the rate: steps done / wall time since the epoch's first
    # half-way through epoch 1: 1 s left in the epoch, and one more epoch of 2 s
    assert re.search(r" 5\d\d/1000  500\.0 steps/s  ETA 0:01 epoch, 0:03 run", out)
    assert re.search(r"epoch 2/2 step 2000 .* 500\.0 steps/s", out)


def test_no_redraw_without_change():
    buf = io.StringIO()
    clock = Clock()
    p = TrainProgress(Console(file=buf, force_terminal=True, width=120), clock=clock)
    for _ in range(10):  # time passes, nothing done: the same text
        p("step", {"epoch": 1, "epochs": 2, "step": 0, "steps": 100})
        clock.t += 1.0
    assert p.redraws == 1
    p("step", {"epoch": 1, "epochs": 2, "step": 5, "steps": 100})
    assert p.redraws == 2
    p.close()


@settings(max_examples=50)
@given(
    dts=st.lists(st.floats(0.0, 0.3), min_size=1, max_size=300),
)
def test_the_throttle_holds_for_any_step_timing(dts: list[float]):
    """However the steps are spaced, never more than REDRAWS_PER_S per second (+1 first)."""
    clock = Clock()
    p = TrainProgress(Console(file=io.StringIO(), force_terminal=True, width=120), clock=clock)
    for i, dt in enumerate(dts):
        p("step", {"epoch": 1, "epochs": 1, "step": i, "steps": len(dts)})
        clock.t += dt
    p.close()
    assert p.redraws <= REDRAWS_PER_S * sum(dts) + 1


def test_durations_and_etas():
    assert [fmt_duration(s) for s in (0, 59.4, 75.2, 3725, None)] == [
        "0:00",
        "0:59",
        "1:15",
        "1:02:05",
        "—",
    ]
    assert eta_s(0, 10, 5.0) is None and eta_s(4, 10, 8.0) == 12.0


def test_a_study_tally_counts_runs_and_estimates_from_the_runs_trained():
    clock = Clock()
    tally = Tally(4, clock=clock)
    assert tally.add(worked=False) == "1/4 runs  elapsed 0:00  ETA —"  # found complete
    clock.t += 10
    assert tally.add() == "2/4 runs  elapsed 0:10  ETA 0:20"  # 2 left x 10 s per run trained
    clock.t += 10
    assert tally.add() == "3/4 runs  elapsed 0:20  ETA 0:10"
    clock.t += 10
    assert tally.add() == "4/4 runs  elapsed 0:30  ETA 0:00"


def test_progress_on_leaves_training_bit_identical(tmp_path):
    """The anchor: the same final parameter hash with the display on and off, and the display
    saw every step of every epoch."""
    from fathom.train.loop import train

    cfg = tiny_config(**{"optim.epochs": 2})
    seen: list[tuple[int, int]] = []
    buf = io.StringIO()
    display = TrainProgress(Console(file=buf, force_terminal=True, width=120))

    def on(event: str, info: dict) -> None:
        if event == "step":
            seen.append((info["epoch"], info["step"]))
        display(event, info)

    with_display = train(cfg, tmp_path / "on", splits=synthetic_splits(), progress=on)
    display.close()
    without = train(cfg, tmp_path / "off", splits=synthetic_splits())
    assert with_display.final_params == without.final_params
    steps = -(-256 // cfg.optim.batch_size)
    assert seen == [(e, i) for e in (1, 2) for i in range(steps)]
    assert "epoch 2/2 step 16" in buf.getvalue()


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.floats(0, 3, allow_nan=False), st.sampled_from(["a", "b", "c"])),
        max_size=40,
    ),
    st.floats(0.1, 2.5, allow_nan=False),
)
def test_throttle_says_at_most_once_per_period_and_never_a_repeat(steps, every):
    """Brute force against the rule: a line is said iff it differs from the last one said
    and ``every`` seconds have passed since then (the first always)."""
    from fathom.base.terminal import Throttle

    now = [0.0]
    said: list[tuple[float, str]] = []
    throttle = Throttle(
        lambda line: said.append((now[0], line)), every_s=every, clock=lambda: now[0]
    )
    want: list[tuple[float, str]] = []
    for dt, line in steps:
        now[0] += dt
        ok = not want or (line != want[-1][1] and now[0] - want[-1][0] >= every)
        if ok:
            want.append((now[0], line))
        assert throttle(line) == ok
    assert said == want


def simulate(
    epochs: int,
    steps: int,
    step_s: float,
    eval_s: float,
    instr_s: float,
    other_s: float,
    evaluations: set[int],
    instruments: set[int],
):
    """A trainer's events with their wall times, from constant costs: epoch 0 evaluates (and
    runs the instruments when due) before training; each epoch trains ``steps`` steps, then
    evaluates / runs instruments when due, then spends ``other_s`` (checkpoint, resume
    state). Yields ``(now, event, info)``; the last ``now`` is the run's end."""
    now, clocks = (
        0.0,
        {"clock/training_s": 0.0, "clock/evaluation_s": 0.0, "clock/telemetry_s": 0.0},
    )
    now += eval_s
    clocks["clock/evaluation_s"] += eval_s
    if 0 in instruments:
        now += instr_s
        clocks["clock/telemetry_s"] += instr_s
    yield now, "epoch", {"epoch": 0, "step": 0, **clocks}
    now += other_s
    sched = {"epochs": epochs, "first": 1, "evaluations": sorted(evaluations - {0})}
    yield now, "schedule", sched | {"instruments": sorted(instruments - {0}), **clocks}
    for e in range(1, epochs + 1):
        for i in range(steps):
            yield now, "step", {"epoch": e, "epochs": epochs, "step": i, "steps": steps}
            now += step_s
            clocks["clock/training_s"] += step_s
        ev, ins = e in evaluations, e in instruments
        if ev or ins:
            yield (
                now,
                "boundary",
                {"epoch": e, "epochs": epochs, "evaluate": ["val"] * ev, "instruments": ins},
            )
            now += eval_s * ev + instr_s * ins
            clocks["clock/evaluation_s"] += eval_s * ev
            clocks["clock/telemetry_s"] += instr_s * ins
            yield now, "epoch", {"epoch": e, "step": e * steps, **clocks}
        yield now, "epoch_end", {"epoch": e, "epochs": epochs, "step": e * steps, **clocks}
        now += other_s
    yield now, "end", {}


def assert_estimate(run, truth: float) -> None:
    """Exact, or (a cost still unmeasured counted zero) a lower bound that says so."""
    if run.lower_bound:
        assert run.seconds <= truth + 1e-9
    else:
        assert run.seconds == pytest.approx(truth, rel=1e-9, abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(
    epochs=st.integers(3, 7),
    steps=st.integers(1, 40),
    costs=st.tuples(
        st.floats(0.0, 4.0), st.floats(0.001, 4.0), st.floats(0.0, 1.0), st.floats(0.001, 0.2)
    ),
    evaluations=st.sets(st.integers(1, 7)),
    instruments=st.sets(st.integers(0, 7)),
    at=st.floats(0.0, 1.0),
)
def test_the_run_eta_is_exact_for_constant_costs(
    epochs, steps, costs, evaluations, instruments, at
):
    """Against the simulated truth: once two epochs have ended, the run's time left equals
    the time the simulated run still takes, at any step and during any evaluation (the
    estimate counts steps, evaluations, instruments and the rest of each epoch apart); an
    instrument not run yet makes it a lower bound, said so."""
    from fathom.base.eta import RunEta

    eval_s, instr_s, other_s, step_s = costs
    evaluations = {e for e in evaluations if e <= epochs} | {epochs}
    instruments = {e for e in instruments if e <= epochs}
    events = list(
        simulate(epochs, steps, step_s, eval_s, instr_s, other_s, {0} | evaluations, instruments)
    )
    end = events[-1][0]
    eta = RunEta()
    ended, checked = 0, 0
    start = {"epoch": 0, "t": 0.0}
    boundary_t = None
    pick = int(at * (len(events) - 2))
    for i, (now, event, info) in enumerate(events[:-1]):
        if event == "step":
            start = {"epoch": info["epoch"], "t": now} if info["step"] == 0 else start
            boundary_t = None
            if ended >= 2 and i >= pick and checked == 0:
                _, run = eta.left(info["epoch"], epochs, info["step"], steps)
                assert_estimate(run, end - now)
                checked += 1
            continue
        if event == "epoch_end":
            info = info | {"steps_in_epoch": steps}
            ended += 1
        eta.event(event, info, now)
        if event == "boundary":
            boundary_t = now
            if ended >= 2 and checked == 0 and i >= pick:
                _, run = eta.left(info["epoch"], epochs, steps, steps, boundary_s=0.0)
                assert_estimate(run, end - now)
                checked += 1
    assert boundary_t is None or boundary_t <= end


def test_the_issue_case_evaluation_dominates_and_the_bar_says_evaluating():
    """Training 1 s an epoch, evaluation 6 s: half-way through epoch 2 of 5 the run has
    0.5 + 6 + 3 x (1 + 6) = 27.5 s left (a training-steps-only ETA said 3.5 s), and the line
    drawn while evaluating says so instead of a bar standing at its last step."""
    buf = io.StringIO()
    clock = Clock()
    p = TrainProgress(Console(file=buf, force_terminal=True, width=140), clock=clock)
    events = list(simulate(5, 100, 0.01, 6.0, 0.0, 0.0, set(range(6)), set()))
    for now, event, info in events[:-1]:
        clock.t = 100.0 + now
        p(event, info)
        if event == "step" and info["epoch"] == 2 and info["step"] == 50:
            _, run = p._left(clock.t)
            assert run.seconds == pytest.approx(27.5)
            assert p._status(clock.t).endswith("ETA 0:06 epoch, 0:28 run")
        if event == "boundary" and info["epoch"] == 3:
            clock.t += 2.0  # 2 s into the evaluation: 4 s of it left, then 2 x 7 s
            assert p._status(clock.t) == "evaluating val  ETA 0:04 epoch, 0:18 run"
    p.close()
    out = buf.getvalue()
    assert "evaluating val" in out
    assert re.search(r"epoch 2/5 step 200 .*  ETA 0:21", out)  # off the live line: the run's


def test_a_time_not_measured_yet_makes_the_eta_a_lower_bound():
    """A resume (no epoch-0 row): the evaluations to come have no measured cost yet."""
    from fathom.base.eta import RunEta

    eta = RunEta()
    eta.event("schedule", {"epochs": 4, "first": 3, "evaluations": [4], "instruments": []}, 0.0)
    epoch, run = eta.left(3, 4, 10, 20, wall_step_s=0.1)
    assert (epoch.seconds, epoch.lower_bound) == (pytest.approx(1.0), True)
    assert run.seconds == pytest.approx(3.0) and run.lower_bound
    from fathom.base.terminal import fmt_eta

    assert fmt_eta(run) == "≥0:03"
