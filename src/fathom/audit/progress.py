"""The audit's progress lines: what it does now and the whole audit's time left.

An audit spends its time in five kinds of work, each timed as it happens and predicted
at its measured cost (:class:`fathom.base.eta.WorkEta`)::

    left = data_left · data_s + checkpoints_left · checkpoint_s + timings_left · timing_s
           + aggregate_s + write_s

* ``data``: loading (and verifying) one recorded split, once per distinct split;
* ``checkpoint:<arm>``: one checkpoint audited end to end: the mask costs, the val and test
  mask passes, the per-checkpoint tables, interactions, class resilience and the router
  (fit, permutation control, routed timing). Measured on this machine (2 cores shared by
  other agents, loaded) on a quick-study residual run: the mask passes ~60%, routed timing
  ~25%, mask costs ~9%, the rest ~6%. The cost differs by arm (routed timing times each
  group of examples the router sends to one mask: 6.5 s on a residual run, 1.5 s on an
  sd_decreasing one), so each arm is predicted at its own mean, an arm not yet met at the
  mean of the arms met;
* ``timing``: the reduced-network timings, once per architecture (one counted ahead: the
  architectures are known only as their models load; each further one is counted as met);
* ``aggregate``: intervals over seeds, paired tests, Holm; ``write``: ``audit.json`` and
  ``audit.md``. Both run once, at the end, so until then they are unmeasured and the ETA is
  a lower bound, said ``≥``.

Skipped runs and missing checkpoints cost nothing. Each line names the phase it starts, so
the last checkpoint's line is followed by ``aggregating ...`` and ``writing ...`` rather
than a frozen ``ETA 0:00``. The clock is injectable (tests use a fake one).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fathom.base.eta import Estimate, WorkEta
from fathom.base.terminal import fmt_duration

_PHASES = {
    "data": "loading data splits",
    "timing": "timing reduced networks",
    "aggregate": "aggregating across seeds (intervals, paired tests, Holm)",
    "write": "writing audit.json and audit.md",
}


def _fmt_left(estimate: Estimate) -> str:
    """``1:02``, ``≥1:02`` (a lower bound) or ``—`` (nothing measured yet)."""
    text = fmt_duration(estimate.seconds)
    return f"≥{text}" if estimate.lower_bound and estimate.seconds is not None else text


class AuditProgress:
    """The whole audit's ETA and the lines that say each phase (module docstring)."""

    def __init__(
        self,
        say: Callable[[str], None],
        total: int,
        planned: dict[str, int],
        data_loads: int,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``total``: every checkpoint requested (the ``N`` of ``k/N``); ``planned``: per
        arm, those that will be audited (not of a skipped run); ``data_loads``: distinct
        splits."""
        self.say = say
        self.clock = clock or time.monotonic
        self.t0 = self.clock()
        self.total, self.done = total, 0
        todo = {f"checkpoint:{arm}": n for arm, n in planned.items()}
        todo |= {"data": data_loads, "aggregate": 1, "write": 1}
        self.eta = WorkEta(todo={**todo, "timing": 1 if any(planned.values()) else 0})

    def left(self) -> Estimate:
        return self.eta.left(self.clock())

    def suffix(self) -> str:
        """``elapsed 0:37  audit ETA ≥1:51``."""
        return f"elapsed {fmt_duration(self.clock() - self.t0)}  audit ETA {_fmt_left(self.left())}"

    def phase(self, kind: str, detail: str = "") -> None:
        """Phase ``kind`` (a key of :data:`_PHASES`) starts: say it with the ETA."""
        if kind == "timing" and self.eta.todo.get("timing", 0) == 0:
            self.eta.todo["timing"] = 1  # a further architecture, met now
        if kind == "aggregate":  # no checkpoint is left: no architecture either
            self.eta.todo["timing"] = 0
        self.eta.begin(kind, self.clock())
        self.say(f"{_PHASES[kind]}{detail}  ({self.suffix()})")

    def checkpoint(self, label: str, arm: str) -> None:
        """A checkpoint of ``arm`` starts (``label``: which run, which checkpoint)."""
        self.eta.begin(f"checkpoint:{arm}", self.clock())
        self.say(f"auditing {label}")

    def counted(self, worked: bool, n: int = 1, arm: str | None = None) -> None:
        """``n`` checkpoints done. ``worked``: audited now (then ``k/N checkpoints`` is said
        with the ETA); else a missing checkpoint of ``arm`` (it was counted as work, and is
        dropped) or, ``arm`` None, a skipped run's (never counted)."""
        self.eta.end(self.clock())
        self.done += n
        if worked:
            self.say(f"  {self.done}/{self.total} checkpoints  {self.suffix()}")
        elif arm is not None:
            self.eta.drop(f"checkpoint:{arm}", n)

    def finish(self) -> float:
        """The last phase ends; the audit's wall seconds."""
        now = self.clock()
        self.eta.end(now)
        return now - self.t0

    def state(self, what: str) -> str:
        """A live line's tail: ``what`` now and the audit's ETA (a terminal's mask ticker)."""
        return f"{what}  audit ETA {_fmt_left(self.left())}"
