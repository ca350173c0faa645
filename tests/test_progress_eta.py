"""Time left of multi-phase work (``fathom.base.eta.WorkEta``): the audit's phases, the head
pair's runs and the reproduction pipeline's steps, each on a hand-advanced clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fathom.audit.progress import AuditProgress
from fathom.base.eta import WorkEta
from fathom.reproduce.head import HeadProgress
from fathom.reproduce.pipeline import pipeline_eta


class Clock:
    """A hand-advanced monotonic clock."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_nothing_measured_is_unknown_and_an_unmeasured_kind_a_lower_bound():
    eta = WorkEta(todo={"a": 2, "b": 1})
    assert eta.left(0.0).seconds is None and eta.left(0.0).lower_bound
    eta.begin("a", 0.0)
    eta.begin("a", 3.0)  # the first a took 3 s; one a under way, b never measured
    left = eta.left(4.0)
    assert left.seconds == 2.0 and left.lower_bound  # 3 - 1 elapsed; b counts zero
    eta.begin("b", 6.0)
    eta.end(10.0)
    assert eta.left(10.0).seconds == 0.0 and not eta.left(10.0).lower_bound


def test_a_prior_stands_in_until_measured_and_a_drop_removes_a_unit():
    eta = WorkEta(todo={"a": 3}, prior={"a": 5.0})
    assert eta.left(0.0).seconds == 15.0 and not eta.left(0.0).lower_bound
    eta.begin("a", 0.0)
    eta.end(1.0)  # measured: 1 s each from now on
    assert eta.left(1.0).seconds == 2.0
    eta.drop("a")
    assert eta.left(1.0).seconds == 1.0
    eta.drop("a", 5)  # never below zero
    assert eta.todo["a"] == 0 and eta.left(1.0).seconds == 0.0


def test_the_unit_under_way_counts_its_cost_less_its_elapsed_time_at_least_zero():
    eta = WorkEta(todo={"a": 2})
    eta.begin("a", 0.0)
    eta.begin("a", 10.0)
    assert [eta.left(10.0 + dt).seconds for dt in (0, 4, 10, 30)] == [10.0, 6.0, 0.0, 0.0]


@settings(max_examples=60, deadline=None)
@given(
    units=st.lists(
        st.tuples(st.sampled_from("xyz"), st.floats(0.0, 100.0, allow_nan=False)),
        min_size=1,
        max_size=12,
    ),
    cut=st.integers(0, 12),
    into=st.floats(0.0, 1.0),
)
def test_left_equals_a_float64_reference(units, cut, into):
    """Run ``units`` (kind, seconds) in order on a fake clock; stop ``into`` of the way through
    unit ``cut``. Reference: every unit still to come at its kind's mean measured cost
    (unmeasured: zero, and a lower bound), the one under way at its mean less its elapsed."""
    cut = min(cut, len(units) - 1)
    todo: dict[str, int] = {}
    for kind, _ in units:
        todo[kind] = todo.get(kind, 0) + 1
    eta, t = WorkEta(todo=dict(todo)), 0.0
    for kind, seconds in units[:cut]:
        eta.begin(kind, t)
        t += seconds
    eta.end(t)
    kind, seconds = units[cut]
    eta.begin(kind, t)
    now = t + into * seconds
    done: dict[str, list[float]] = {}
    for k, s in units[:cut]:
        done.setdefault(k, []).append(s)
    mean = {k: sum(v) / len(v) for k, v in done.items()}
    ref, lower = 0.0, False
    for k, _ in units[cut + 1 :]:
        if k in mean:
            ref += mean[k]
        else:
            lower = True
    if kind in mean:
        ref += max(0.0, mean[kind] - (now - t))
    else:
        lower = True
    got = eta.left(now)
    if not any(k in mean for k, _ in units[cut:]):  # no unit left has a cost: unknown
        assert got.seconds is None
    else:
        assert abs(got.seconds - ref) <= 1e-9 * max(1.0, ref) and got.lower_bound == lower


def test_audit_counts_data_timing_aggregation_and_writing_and_says_each_phase():
    """Two runs x two checkpoints (10 s each), one data load (4 s), one timing (6 s): after the
    first checkpoint the ETA holds the three left at its measured cost, not the data load or
    the timing, as a lower bound (aggregation and writing are still to be measured); after the
    last, the ETA is unknown rather than 0:00, and aggregation and writing are said."""
    said: list[str] = []
    clock = Clock()
    p = AuditProgress(said.append, total=6, planned={"res": 4}, data_loads=1, clock=clock)
    p.counted(False, 2)  # a plain run: nothing to remove, skipped
    assert said == []
    p.phase("data", " for r1")
    clock.t += 4
    p.checkpoint("r1 at selected", "res")
    clock.t += 10
    p.phase("timing", " of MLP")
    clock.t += 6
    p.counted(True)
    assert said[-1] == "  3/6 checkpoints  elapsed 0:20  audit ETA ≥0:30"
    for label in ("r1 at final", "r2 at selected", "r2 at final"):
        p.checkpoint(label, "res")
        clock.t += 10
        p.counted(True)
    assert said[-1] == "  6/6 checkpoints  elapsed 0:50  audit ETA —"  # not a frozen 0:00
    p.phase("aggregate")
    clock.t += 2
    p.phase("write")
    assert said[-2].startswith("aggregating across seeds") and said[-1].startswith("writing")
    clock.t += 1
    assert p.finish() == 53.0
    assert [s.split("  (")[0] for s in said if "  (" in s] == [
        "loading data splits for r1",
        "timing reduced networks of MLP",
        "aggregating across seeds (intervals, paired tests, Holm)",
        "writing audit.json and audit.md",
    ]


def test_audit_drops_a_missing_checkpoint_and_the_live_state_carries_the_eta():
    clock = Clock()
    said: list[str] = []
    p = AuditProgress(said.append, total=3, planned={"res": 3}, data_loads=0, clock=clock)
    p.checkpoint("r1 at selected", "res")
    clock.t += 8
    p.counted(True)
    p.counted(False, arm="res")  # a checkpoint that could not be loaded: no work, no line
    assert p.eta.todo["checkpoint:res"] == 1 and len(said) == 2
    p.checkpoint("r1 at final", "res")
    clock.t += 3
    assert p.state("3/32 mask passes") == "3/32 mask passes  audit ETA ≥0:05"


def events(p: HeadProgress, clock: Clock, epochs: int, steps: int, dt: float, evals: float):
    """One run as the trainer sends it: the schedule, epoch 0's evaluation, then per epoch its
    steps, its evaluation and its end (clocks cumulative)."""
    clocks = {"clock/training_s": 0.0, "clock/evaluation_s": 0.0, "clock/telemetry_s": 0.0}
    sched = {"epochs": epochs, "evaluations": list(range(1, epochs + 1)), "instruments": []}
    p("schedule", sched | clocks)
    p("epoch", {"epoch": 0, "clock/evaluation_s": evals, "clock/telemetry_s": 0.0})
    clock.t += evals
    train = evaluation = 0.0
    for epoch in range(1, epochs + 1):
        for i in range(steps):
            p("step", {"epoch": epoch, "epochs": epochs, "step": i, "steps": steps})
            clock.t += dt
        p("boundary", {"epoch": epoch, "evaluate": ["val"], "instruments": []})
        clock.t += evals
        train, evaluation = train + steps * dt, evaluation + evals
        p(
            "epoch_end",
            {
                "epoch": epoch,
                "epochs": epochs,
                "clock/training_s": train,
                "clock/evaluation_s": evaluation,
                "clock/telemetry_s": 0.0,
            },
        )


def test_head_pair_eta_counts_the_second_run_at_the_first_runs_cost():
    """Each run: epoch 0's evaluation (1 s), then 2 epochs of 10 steps x 0.5 s + 1 s of
    evaluation: 13 s. After run 1's first epoch: 6 s left in it, and run 2 predicted at run 1's
    predicted total (13 s); after run 1: run 2 at its measured 13 s."""
    clock = Clock()
    said: list[str] = []
    p = HeadProgress(said.append, runs=2, clock=clock)
    p.start("head-relu")
    events(p, clock, epochs=2, steps=10, dt=0.5, evals=1.0)
    p.end("trained", "complete")
    assert said[0] == "head-relu (1/2 runs) epoch 1/2  elapsed 0:07  run ETA 0:06  pair ETA 0:19"
    assert said[2] == "head-relu (1/2 runs) trained complete in 13.0 s  pair ETA 0:13"
    p.start("head-linear")
    events(p, clock, epochs=2, steps=10, dt=0.5, evals=1.0)
    p.end("trained", "complete")
    assert said[3].endswith("run ETA 0:06  pair ETA 0:06") and said[-1].endswith("ETA 0:00")


def test_pipeline_eta_uses_recorded_step_times_and_skips_leave_the_count():
    class State:
        def __init__(self) -> None:
            self.steps = {
                "study": {"wall_s": 100.0},
                "audit": {"wall_s": 200.0},
                "curvature:a": {"wall_s": 10.0},
                "curvature:b": {"wall_s": 30.0},
            }

    plan = dict.fromkeys(["study", "audit", "curvature:a", "curvature:b", "head", "report"], "")
    eta = pipeline_eta(plan, State())
    start = eta.left(0.0)
    assert start.seconds == 100 + 200 + 2 * 20 and start.lower_bound  # head, report unknown
    eta.drop("study")  # skipped: complete and verified
    eta.begin("audit", 0.0)
    eta.begin("curvature", 50.0)  # the audit took 50 s here: its measured cost from now
    assert eta.left(50.0).seconds == 2 * 20
    eta.begin("curvature", 54.0)  # measured 4 s: the next curvature step at 4 s
    assert eta.left(55.0).seconds == 3.0 and eta.left(55.0).lower_bound


def test_each_arm_at_its_own_cost_and_an_arm_not_met_at_the_arms_met():
    """Routed timing makes a residual checkpoint cost more than an sd one: after one of each,
    each arm's checkpoints left are counted at its own cost; before sd was met, at res's."""
    clock = Clock()
    p = AuditProgress(lambda _: None, total=4, planned={"res": 2, "sd": 2}, data_loads=0,
                      clock=clock)  # fmt: skip
    p.eta.prior |= {"timing": 0.0, "aggregate": 0.0, "write": 0.0}
    p.checkpoint("r1", "res")
    clock.t += 12
    p.counted(True)
    assert p.left().seconds == 3 * 12.0 and not p.left().lower_bound
    p.checkpoint("r2", "res")
    clock.t += 12
    p.checkpoint("s1", "sd")
    clock.t += 2
    p.counted(True)
    assert p.left().seconds == 2.0


def test_family_fallback_only_within_the_family_and_after_own_measure():
    eta = WorkEta(todo={"ck:a": 1, "ck:b": 1, "other": 1})
    eta.begin("ck:a", 0.0)
    eta.end(4.0)
    assert eta.cost("ck:b") == 4.0 and eta.cost("other") is None and eta.cost("ck") is None
    eta.begin("ck:b", 4.0)
    eta.end(5.0)
    assert eta.cost("ck:b") == 1.0 and eta.cost("ck:c") == 2.5
