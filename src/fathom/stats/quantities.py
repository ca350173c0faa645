"""The compared quantities, each declared once: unit, scale, direction, smallest effect of
interest δ and resolution r (values from :class:`~fathom.stats.rules.Rules`).

* accuracy: ``d`` in percentage points; the resolution of one accuracy on ``N`` examples is
  the binomial bound ``u = 10⁴ · ¼ / N`` pp² (``p(1 − p) <= ¼``): it depends on the design
  (N), not on the values compared, so a common shift of both arms changes no verdict;
  δ = ``rules.accuracy_pp``.
* cross entropy: ``d`` in nats, lower is better; δ = ``rules.ce_nats``,
  r = ``rules.ce_resolution_nats`` (its per-example variance is not recorded).
* a ratio of positive quantities: ``d = ln a − ln b``; δ = ``rules.log_ratio``,
  r = ``rules.log_ratio_resolution``; no better direction unless stated.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from fathom.base.units import percent
from fathom.stats.results import Quantity
from fathom.stats.rules import DEFAULT_RULES, Rules

ACCURACY_RESOLUTION_PP = 0.01
"""Accuracy is printed to 0.01 pp: the floor when the evaluation-set size is unknown."""


def accuracy(name: str = "test accuracy", rules: Rules = DEFAULT_RULES) -> Quantity:
    """Accuracy compared in percentage points (higher is better)."""
    return Quantity(
        name=name,
        unit="pp",
        higher_is_better=True,
        smallest_effect=rules.accuracy_pp,
        resolution=ACCURACY_RESOLUTION_PP,
    )


def cross_entropy(name: str = "test CE", rules: Rules = DEFAULT_RULES) -> Quantity:
    """Cross entropy compared in nats (lower is better)."""
    return Quantity(
        name=name,
        unit="nats",
        higher_is_better=False,
        smallest_effect=rules.ce_nats,
        resolution=rules.ce_resolution_nats,
    )


def ratio(
    name: str, rules: Rules = DEFAULT_RULES, higher_is_better: bool | None = None
) -> Quantity:
    """A positive quantity compared as a ratio (``ln`` scale)."""
    return Quantity(
        name=name,
        unit="ratio",
        scale="log ratio",
        higher_is_better=higher_is_better,
        smallest_effect=rules.log_ratio,
        resolution=rules.log_ratio_resolution,
    )


def accuracy_variance_pp(n_eval: int | None) -> float:
    """The binomial bound on the variance of one accuracy on ``n_eval`` examples, in pp²:
    ``10⁴ · ¼ / N`` (0 when ``n_eval`` is unknown: the printed resolution then applies)."""
    if not n_eval:
        return 0.0
    return percent(1.0) ** 2 * 0.25 / n_eval


def fraction_problem(accuracies: Iterable[float | None]) -> str | None:
    """Why accuracies are not fractions in [0, 1] (``None`` and non-finite values skipped),
    or None: a set whose values exceed 1 but lie within [0, 100] looks like percent."""
    accs = [float(a) for a in accuracies if a is not None and math.isfinite(float(a))]
    above = [a for a in accs if a > 1.0]
    if above and all(0.0 <= a <= 100.0 for a in accs):
        return (
            f"accuracies look like percent (up to {max(above):g}, above 1); accuracies are "
            "fractions in [0, 1]: divide by 100"
        )
    outside = [a for a in accs if not 0.0 <= a <= 1.0]
    if outside:
        return (
            f"accuracies {outside[:3]} lie outside [0, 1]; give each as the fraction of the "
            "test set answered correctly"
        )
    return None
