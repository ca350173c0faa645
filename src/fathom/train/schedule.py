"""The learning rate's one owner: the rate every step applies, from ``optim`` alone.

``lr_i = optim.lr * m(t_i)`` with ``t_i = epoch - 1 + i / steps`` (fractional epochs done
before step ``i`` of the 1-based ``epoch``) and ``m`` the multiplier of ``optim.schedule``
(formulas in :class:`fathom.config.ScheduleConfig`). The epoch plan carries ``lr_i``
(``EpochPlan.lrs``), the one channel: the step body hands it to the update
(:mod:`fathom.train.step`; a captured graph reads it from a device scalar), the trainer records
the rate of the epoch's last step as ``optim/lr`` and gives the same number to the telemetry
(``EpochContext.lr``) and to a divergence message. ``param_group["lr"]`` is written only for a
torch optimizer, which reads nothing else.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from fathom.config import OptimConfig, ScheduleConfig


def lr_multiplier(schedule: Sequence[Sequence[float]] | None, epoch_progress: float) -> float:
    """Piecewise-linear multiplier at fractional epoch ``epoch_progress`` (constant outside)."""
    if not schedule:
        return 1.0
    xs = [float(e) for e, _ in schedule]
    ys = [float(m) for _, m in schedule]
    if epoch_progress <= xs[0]:
        return ys[0]
    if epoch_progress >= xs[-1]:
        return ys[-1]
    j = bisect.bisect_right(xs, epoch_progress)
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return y0 + (y1 - y0) * (epoch_progress - x0) / (x1 - x0)


def multiplier(schedule: ScheduleConfig, t: float, epochs: int) -> float:
    """``m(t)`` of ``schedule`` at ``t`` fractional epochs done, for ``epochs`` in total."""
    kind = schedule.kind
    if kind == "constant":
        return 1.0
    if kind == "piecewise":
        return lr_multiplier(schedule.points, t)
    if kind == "exponential":
        return float(schedule.gamma) ** math.floor(t)
    w, s, f = schedule.warmup_epochs, schedule.warmup_start, schedule.final
    if t < w:
        return s + (1.0 - s) * t / w
    span = epochs - w
    u = min(max((t - w) / span, 0.0), 1.0) if span > 0 else 1.0
    if kind == "warmup_linear":
        return 1.0 + (f - 1.0) * u
    return f + (1.0 - f) * 0.5 * (1.0 + math.cos(math.pi * u))


def epoch_lrs(optim: OptimConfig, epoch: int, steps: int) -> list[float]:
    """The rate of each of the ``steps`` steps of the 1-based ``epoch``."""
    sched, lr, total = optim.schedule, optim.lr, optim.epochs
    if sched.kind == "constant":
        return [lr] * steps
    return [lr * multiplier(sched, epoch - 1 + i / steps, total) for i in range(steps)]
