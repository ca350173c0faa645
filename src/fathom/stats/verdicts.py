"""The verdict vocabulary: every outcome a comparison or a decision can state, as ``Literal``
types, so that a verdict is one of a closed list a type checker and pydantic both hold to.

* :data:`ComparisonVerdict`: one paired comparison (:func:`fathom.stats.inference.verdict_of`):
  *better* / *worse* (a quantity with a better direction), *higher* / *lower* (one without),
  *equivalent* (the interval inside ``[-δ, δ]``), *not established*, or *no comparison*
  (nothing paired to compare);
* :data:`LevelVerdict` and :data:`TrendVerdict`: the two answers of a depth-scaling table
  (:mod:`fathom.stats.scaling_answers`), its level across depths and its trend with depth;
* :data:`RankingVerdict`: a checkpoint ranking (:mod:`fathom.stats.ranking`);
* :data:`DecisionVerdict`: any of the decisions' verdicts (a :class:`~fathom.stats.results.Decision`).

The rules that produce them live with their idea; which rule re-derives a decision is the
table :data:`fathom.stats.claims.DECISION_RULES`.

Beside the vocabulary, the two descriptive helpers reports show next to verdicts and never as
one: ``rank_disagreement`` (the ranking of means at two checkpoints, side by side) and
``first_crossing`` (when a curve first reaches a target).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Union

from fathom.errors import FathomError

ComparisonVerdict = Literal[
    "better", "worse", "higher", "lower", "equivalent", "not established", "no comparison"
]
"""A paired comparison's verdict (module docstring)."""

LevelVerdict = Literal[
    "better across depths",
    "worse across depths",
    "equivalent across depths",
    "not established",
    "inconclusive",
    "no comparison",
    "no conclusion",
]
"""The *level*: is the candidate better than the baseline across the depths (their mean)?"""

TrendVerdict = Literal[
    "scales better",
    "scales worse",
    "scales equivalently",
    "not established",
    "inconclusive",
    "no comparison",
    "no conclusion",
]
"""The *scaling*: does the candidate's advantage change with depth (change and slope)?"""

RankingVerdict = Literal["differs", "not established"]
"""A checkpoint ranking: *differs* only when some pair is established in opposite directions
at the selected and the final checkpoint."""

DecisionVerdict = Union[LevelVerdict, TrendVerdict, RankingVerdict]  # noqa: UP007
"""What a decision may conclude."""

VERDICTS: tuple[ComparisonVerdict, ...] = (
    "better", "worse", "higher", "lower", "equivalent", "not established", "no comparison"
)  # fmt: skip
NOT_ESTABLISHED: ComparisonVerdict = "not established"
OPPOSITE: dict[ComparisonVerdict, ComparisonVerdict] = {
    "better": "worse",
    "worse": "better",
    "higher": "lower",
    "lower": "higher",
}
"""A comparison's verdict with its arms swapped (equivalent and the rest stay)."""


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
