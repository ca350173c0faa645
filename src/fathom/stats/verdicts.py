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
"""

from __future__ import annotations

from typing import Literal, Union

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
ESTABLISHED: tuple[ComparisonVerdict, ...] = ("better", "worse", "higher", "lower", "equivalent")
OPPOSITE: dict[ComparisonVerdict, ComparisonVerdict] = {
    "better": "worse",
    "worse": "better",
    "higher": "lower",
    "lower": "higher",
}
"""A comparison's verdict with its arms swapped (equivalent and the rest stay)."""
