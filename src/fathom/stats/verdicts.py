"""Rankings and first crossings: descriptive helpers of the study summary.

Every comparison verdict comes from :mod:`fathom.stats.inference` (the rule of
``docs/statistics.md``); this module ranks point estimates (``rank_disagreement``: the
ranking of means at two checkpoints, shown side by side, never a verdict by itself) and
finds when a curve first reaches a target (``first_crossing``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fathom.errors import FathomError


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
