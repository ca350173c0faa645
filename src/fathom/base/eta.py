"""Time left, from what was measured: the estimators behind every progress display.

A training run spends its time on four things, each measured on its own clock (the clocks
of ``docs/architecture.md``): optimizer steps (training clock), evaluations (evaluation
clock), instruments (telemetry clock) and the rest of an epoch's wall time (checkpoints,
the resume state, history writes). :class:`RunEta` predicts each from what this invocation
measured and adds them::

    left = steps_left · step_s + evals_left · eval_s + instr_left · instr_s + epochs_left · other_s

so a run whose evaluations cost more than its training (a small width on the CPU) is not
predicted at its training time alone.

Every estimate is ``None`` before anything is measured, and a *lower bound* (said ``≥``)
while a term it needs has no measurement yet (a resumed run that has not evaluated yet).
Nothing here reads a clock: callers pass the times, so the rules are tested with fake
clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Mean:
    """A running mean (``None`` before the first value)."""

    total: float = 0.0
    n: int = 0

    def add(self, x: float) -> None:
        self.total += x
        self.n += 1

    @property
    def value(self) -> float | None:
        return self.total / self.n if self.n else None


_CLOCKS = ("clock/training_s", "clock/evaluation_s", "clock/telemetry_s")
"""The cumulative clocks a trainer's events carry (seconds)."""


def _clocks_of(info: dict[str, Any]) -> tuple[float, float, float]:
    """The :data:`_CLOCKS` of an event, in their order (training, evaluation, telemetry)."""
    training, evaluation, telemetry = (float(info[k]) for k in _CLOCKS)
    return training, evaluation, telemetry


@dataclass
class Estimate:
    """``seconds`` left (``None``: nothing measured yet); ``lower_bound`` when a term that
    is still to come had no measurement (it counted zero)."""

    seconds: float | None
    lower_bound: bool = False


@dataclass
class RunEta:
    """A training run's time left, from the trainer's progress events (module docstring).

    * ``step_s``: training clock per optimizer step over the epochs completed in this
      invocation (before one completed: the caller's wall time per step of the epoch under
      way);
    * ``eval_s``: evaluation clock per evaluated boundary (epoch 0's included);
    * ``instr_s``: telemetry clock per boundary that ran an instrument; the first one
      (cold: it discovers the model's layers) only until a warm one is measured;
    * ``other_s``: per completed epoch after the first of this invocation, its wall time
      (between two ``epoch_end`` events: the previous epoch's checkpoint and resume state
      lie there) less what the three clocks counted in it, at least zero.

    Feed it :meth:`event` with every ``(event, info)`` and the wall time of the event
    (``epoch_end`` with ``steps_in_epoch``, the steps the epoch took); ask :meth:`left`. Without a ``"schedule"`` event (a trainer of another version) no
    evaluation or instrument is counted ahead: the estimate is the training clock's.
    """

    epochs: int | None = None
    evaluations: frozenset[int] = frozenset()
    instruments: frozenset[int] = frozenset()
    step_s: Mean = field(default_factory=Mean)
    eval_s: Mean = field(default_factory=Mean)
    instr_cold_s: Mean = field(default_factory=Mean)
    instr_s: Mean = field(default_factory=Mean)
    other_s: Mean = field(default_factory=Mean)
    scheduled: bool = False
    _clocks: tuple[float, float, float] = (0.0, 0.0, 0.0)
    _last_wall: float | None = None
    _boundary: dict[int, tuple[bool, bool]] = field(default_factory=dict)

    def event(self, event: str, info: dict[str, Any], now: float) -> None:
        """Take one trainer event (``schedule``, ``epoch``, ``boundary``, ``epoch_end``)."""
        if event == "schedule":
            self.scheduled = True
            self.epochs = info["epochs"]
            self.evaluations = frozenset(info["evaluations"])
            self.instruments = frozenset(info["instruments"])
            if all(k in info for k in _CLOCKS):
                self._clocks = _clocks_of(info)
        elif event == "epoch" and info.get("epoch") == 0:
            self._epoch_zero(info)
        elif event == "boundary":
            self._boundary[info["epoch"]] = (bool(info["evaluate"]), bool(info["instruments"]))
        elif event == "epoch_end":
            self._epoch_end(info, now)

    def _epoch_zero(self, row: dict[str, Any]) -> None:
        """Epoch 0 (before training) always evaluates, and runs the instruments when due
        (a telemetry clock above zero), on fresh clocks."""
        if row.get("clock/evaluation_s") is not None:
            self.eval_s.add(float(row["clock/evaluation_s"]))
        if (row.get("clock/telemetry_s") or 0.0) > 0:
            self.instr_cold_s.add(float(row["clock/telemetry_s"]))

    def _epoch_end(self, info: dict[str, Any], now: float) -> None:
        if not all(k in info for k in _CLOCKS):
            return
        clocks = _clocks_of(info)
        train, evaluation, instr = (c - b for c, b in zip(clocks, self._clocks, strict=True))
        self._clocks = clocks
        steps = info.get("steps_in_epoch")
        if steps:  # per step, weighted by steps: Σ training clock / Σ steps
            self.step_s.total += train
            self.step_s.n += steps
        evaluated, instrumented = self._boundary.pop(info["epoch"], (False, False))
        if evaluated:
            self.eval_s.add(evaluation)
        if instrumented:
            (self.instr_s if self.instr_cold_s.n else self.instr_cold_s).add(instr)
        if self._last_wall is not None:
            self.other_s.add(max(0.0, now - self._last_wall - train - evaluation - instr))
        self._last_wall = now

    def instr_each_s(self) -> float | None:
        """Telemetry clock per instrumented boundary still to come (warm, else cold)."""
        return self.instr_s.value if self.instr_s.n else self.instr_cold_s.value

    def left(
        self,
        epoch: int,
        epochs: int,
        done: int,
        steps: int,
        wall_step_s: float | None = None,
        boundary_s: float | None = None,
    ) -> tuple[Estimate, Estimate]:
        """``(this epoch, the run)`` left while epoch ``epoch`` of ``epochs`` (the schedule's,
        once it came) has ``done`` of ``steps`` steps done; ``boundary_s``: seconds since its evaluation / instruments began (then
        its steps are all done). ``wall_step_s``: the wall time per step of this epoch, used
        until an epoch has completed."""
        step_s = self.step_s.value if self.step_s.n else wall_step_s
        if step_s is None:
            return Estimate(None), Estimate(None)
        epochs = self.epochs if self.epochs is not None else epochs
        lower = False

        def boundary_cost(e: int) -> float:
            nonlocal lower
            cost = 0.0
            for due, each in (
                (e in self.evaluations, self.eval_s.value),
                (e in self.instruments, self.instr_each_s()),
            ):
                if due and each is None:
                    lower = True
                elif due and each is not None:
                    cost += each
            return cost

        this = boundary_cost(epoch)
        if boundary_s is not None:
            this = max(0.0, this - boundary_s)
        this += (steps - done) * step_s
        later = sum(boundary_cost(e) for e in range(epoch + 1, epochs + 1))
        later += steps * step_s * max(0, epochs - epoch)
        other = (self.other_s.value or 0.0) * max(0, epochs - epoch + 1)
        return Estimate(this, lower), Estimate(this + later + other, lower)


@dataclass
class WorkEta:
    """Time left of a job made of units of named kinds (an audit's checkpoints, its data
    loads, its aggregation; a pipeline's steps), each kind at its measured cost::

        left = Σ_kind todo[kind] · cost(kind) + max(0, cost(current) − its elapsed time)

    ``cost(kind)``: the mean wall time of the units of that kind measured in this
    invocation (:meth:`begin` to the next :meth:`begin` or :meth:`end`), else ``prior[kind]``
    (an estimate the caller states: an earlier run's recorded time), else the mean of its
    family's measured units (:meth:`cost`), else unknown: it counts
    zero and the estimate is a *lower bound*. ``None`` (unknown, not ``≥0:00``) while no unit
    left has a cost. A unit
    that turns out not to run (a skipped run, a missing checkpoint) is :meth:`drop`-ped.
    """

    todo: dict[str, int] = field(default_factory=dict)
    prior: dict[str, float] = field(default_factory=dict)
    measured: dict[str, Mean] = field(default_factory=dict)
    current: tuple[str, float] | None = None

    def begin(self, kind: str, now: float) -> None:
        """Unit ``kind`` starts at ``now`` (the unit under way, if any, ends there)."""
        self.end(now)
        self.drop(kind)
        self.current = (kind, now)

    def end(self, now: float) -> float | None:
        """The unit under way ends at ``now``; its measured seconds (``None``: none was)."""
        if self.current is None:
            return None
        kind, t0 = self.current
        self.current = None
        self.measured.setdefault(kind, Mean()).add(now - t0)
        return now - t0

    def drop(self, kind: str, n: int = 1) -> None:
        """``n`` units of ``kind`` will not run (at least zero stay to do)."""
        self.todo[kind] = max(0, self.todo.get(kind, 0) - n)

    def cost(self, kind: str) -> float | None:
        """Seconds per unit of ``kind``: measured here, else the prior, else the mean of the
        units measured of its family (the kinds sharing its name before ``:``: an audit's
        ``checkpoint:<arm>`` not yet met at the arms met so far), else ``None``."""
        m = self.measured.get(kind)
        if m is not None and m.n:
            return m.value
        if kind in self.prior:
            return self.prior[kind]
        if ":" not in kind:
            return None
        family = kind.split(":")[0] + ":"
        kin = [m for k, m in self.measured.items() if k.startswith(family) and m.n]
        return sum(m.total for m in kin) / sum(m.n for m in kin) if kin else None

    def left(self, now: float) -> Estimate:
        """The time left at ``now`` (class docstring)."""
        total, lower, known = 0.0, False, False
        units = [(k, n, 0.0) for k, n in self.todo.items() if n > 0]
        if self.current is not None:
            units.append((self.current[0], 1, now - self.current[1]))
        for kind, n, elapsed in units:
            each = self.cost(kind)
            if each is None:
                lower = True
            else:
                known = True
                total += max(0.0, n * each - elapsed)
        return Estimate(total if known or not units else None, lower)
