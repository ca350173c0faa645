"""Computed verdicts: every sentence that compares methods is produced here.

A comparison of arm ``a`` against arm ``b`` is read off the interval of the paired
difference ``d = a - b`` (see :mod:`fathom.stats.intervals`)::

    better           low > 0  (or high < 0 when lower is better)
    worse            high < 0 (or low > 0 when lower is better)
    not established  the interval contains 0, or n < 2 so there is no interval
    no comparison    an arm carries an excluding failure flag (diverged, at chance,
                     incomplete); the arm is listed, never ranked

The depth-scaling verdict (:mod:`fathom.stats.scaling`) applies the same rules per depth
and to the change of accuracy over a contiguous range of depths.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fathom.errors import FathomError
from fathom.stats.flags import EXCLUDING_FLAGS
from fathom.stats.intervals import Interval

VERDICTS = ("better", "worse", "not established", "no comparison")


@dataclass(frozen=True)
class Verdict:
    """The outcome of one comparison: one of :data:`VERDICTS`, why, and its interval."""

    verdict: str
    reason: str
    diff: Interval | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "diff": None if self.diff is None else self.diff.to_dict(),
        }


def signed(x: float | None, digits: int = 4) -> str:
    """``x`` with its sign (``+0.0123``), or ``null``."""
    return "null" if x is None else f"{x:+.{digits}f}"


def interval_text(diff: Interval, digits: int = 4) -> str:
    """``95% paired t interval [low, high], n=N`` (or ``n=N, no interval``)."""
    if not diff.has_interval:
        return f"n={diff.n}, no interval"
    pct = f"{100 * diff.level:g}%"
    return f"{pct} {diff.method} interval [{signed(diff.low, digits)}, {signed(diff.high, digits)}], n={diff.n}"


def _excluding(flags: Sequence[str]) -> list[str]:
    return sorted({f for f in flags if f in EXCLUDING_FLAGS})


def compare(
    diff: Interval | None,
    *,
    higher_is_better: bool,
    flags_a: Sequence[str],
    flags_b: Sequence[str],
    name_a: str = "a",
    name_b: str = "b",
) -> Verdict:
    """Verdict of ``a`` against ``b`` from the paired difference ``diff = a - b``.

    ``flags_a`` / ``flags_b`` are the failure flags of each arm's runs (their union over
    seeds). An excluding flag on either arm gives ``"no comparison"``; ``not_fitting``
    is kept as a caveat in the reason. ``diff`` may be ``None`` only when an arm is
    excluded (no difference could be formed).
    """
    bad = [(name, _excluding(flags)) for name, flags in ((name_a, flags_a), (name_b, flags_b))]
    bad = [(name, fl) for name, fl in bad if fl]
    if bad:
        listed = "; ".join(f"{name} excluded ({', '.join(fl)})" for name, fl in bad)
        return Verdict("no comparison", listed, diff)
    if diff is None:
        raise FathomError(
            "compare: no difference interval given for two arms without excluding flags; "
            "pass paired_difference(a, b)"
        )
    caveats = [
        f"caveat: {name} not fitting"
        for name, flags in ((name_a, flags_a), (name_b, flags_b))
        if "not_fitting" in flags
    ]
    if not diff.has_interval:
        verdict, why = "not established", f"n={diff.n} paired seed(s): no interval"
    elif diff.low > 0 or diff.high < 0:
        a_higher = diff.low > 0
        verdict = "better" if a_higher == higher_is_better else "worse"
        why = f"the interval excludes zero ({interval_text(diff)})"
    else:
        verdict, why = "not established", f"the interval includes zero ({interval_text(diff)})"
    return Verdict(verdict, "; ".join([why, *caveats]), diff)


def verdict_sentence(
    verdict: Verdict, *, name_a: str, name_b: str, metric: str, digits: int = 4
) -> str:
    """The one sentence a report prints for a comparison of ``name_a`` against ``name_b``.

    Examples::

        "SD-constant vs plain on test accuracy: better (difference +0.0031, 95% paired t
         interval [+0.0012, +0.0050], n=3)."
        "SD-constant vs plain on test accuracy: not established (the interval includes zero ...)."
        "SD-constant vs plain on test accuracy: no comparison (plain excluded (diverged))."
    """
    head = f"{name_a} vs {name_b} on {metric}: {verdict.verdict}"
    if verdict.verdict in ("better", "worse"):
        assert verdict.diff is not None
        body = f"difference {signed(verdict.diff.estimate, digits)}, {interval_text(verdict.diff, digits)}"
        caveats = [part for part in verdict.reason.split("; ") if part.startswith("caveat")]
        return f"{head} ({'; '.join([body, *caveats])})."
    if verdict.verdict == "not established" and verdict.diff is not None:
        return f"{head} (difference {signed(verdict.diff.estimate, digits)}; {verdict.reason})."
    return f"{head} ({verdict.reason})."


@dataclass(frozen=True)
class RankComparison:
    """Ranking of arms at the selected and the final checkpoints, side by side."""

    selected_order: list[str]
    final_order: list[str]
    disagree: bool
    rows: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


def _order(values: Mapping[str, float], higher_is_better: bool) -> list[str]:
    sign = -1.0 if higher_is_better else 1.0
    return sorted(values, key=lambda name: (sign * values[name], name))


def rank_disagreement(
    selected: Mapping[str, float],
    final: Mapping[str, float],
    *,
    higher_is_better: bool = True,
) -> RankComparison:
    """Rank arms by their value at the selected and at the final checkpoint.

    ``disagree`` is True when the two orders differ; reports must then show ``rows``
    (name, value and rank at each checkpoint) side by side. Ties are broken by name.
    """
    if set(selected) != set(final):
        raise FathomError(
            f"rank_disagreement: arms differ between selected {sorted(selected)} and final "
            f"{sorted(final)}; pass the same arms at both checkpoints"
        )
    for where, values in (("selected", selected), ("final", final)):
        for name, v in values.items():
            if v is None or not math.isfinite(v):
                raise FathomError(
                    f"rank_disagreement: {where} value of {name!r} is {v!r}; rank only arms "
                    "that were not excluded by their failure flags"
                )
    sel_order = _order(selected, higher_is_better)
    fin_order = _order(final, higher_is_better)
    rows = [
        {
            "name": name,
            "selected": selected[name],
            "selected_rank": sel_order.index(name) + 1,
            "final": final[name],
            "final_rank": fin_order.index(name) + 1,
        }
        for name in sel_order
    ]
    return RankComparison(sel_order, fin_order, sel_order != fin_order, rows)


def first_crossing(
    times: Sequence[float], values: Sequence[float | None], target: float
) -> float | None:
    """First observed time at which ``value >= target``; ``None`` if never observed.

    Values exist only at evaluation epochs, so the true crossing lies between the
    previous evaluation time and the returned one: the evaluation cadence bounds the
    precision (with evaluation every 5 epochs the answer can be up to 5 epochs late).
    ``None`` values (not evaluated) are skipped; times must be non-decreasing.
    """
    if len(times) != len(values):
        raise FathomError(
            f"first_crossing: {len(times)} times but {len(values)} values; pass one time per value"
        )
    if any(t1 < t0 for t0, t1 in itertools.pairwise(times)):
        raise FathomError("first_crossing: times decrease; pass them in the order observed")
    for t, v in zip(times, values):
        if v is not None and math.isfinite(v) and v >= target:
            return float(t)
    return None
