"""Trained, failed or undetermined: one run's accuracy against chance, with its uncertainty.

A run evaluated on ``N`` examples of ``C`` classes with accuracy ``a`` has ``k = round(a N)``
correct answers. Its exact (Clopper–Pearson) two-sided interval at level ``L``::

    low  = Beta⁻¹((1 − L)/2;  k,     N − k + 1)     (0 when k = 0)
    high = Beta⁻¹((1 + L)/2;  k + 1, N − k)         (1 when k = N)

With chance ``p₀ = 1/C`` and the trained boundary ``p₁ = p₀ + m (1 − p₀)`` (``m`` is
:attr:`~fathom.stats.rules.Rules.chance_margin`):

* **failed**: ``low <= p₀`` — the accuracy is statistically indistinguishable from chance
  (or below it); a diverged run (no finite accuracy) has failed;
* **trained**: ``low > p₁`` — clearly above chance;
* **undetermined**: otherwise — above chance, but not clearly above the boundary. An
  undetermined run never decides a verdict: the comparison that would use it says so.

A 2-class run at 99.9% and a 3-class run at 60% (N in the hundreds or more) are trained; a
100-class run at 2% on 10,000 examples (the old ``2/C`` cut) is undetermined.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict
from scipy.stats import beta

from fathom.stats.rules import DEFAULT_RULES, Rules

STATES = ("trained", "failed", "undetermined")


class ChanceTest(BaseModel):
    """One run's accuracy against chance: its state and the interval that decided it."""

    model_config = ConfigDict(frozen=True)

    state: str
    accuracy: float | None
    n_eval: int
    classes: int
    chance: float
    boundary: float
    low: float | None
    high: float | None
    level: float
    method: str = "Clopper-Pearson"


def clopper_pearson(k: int, n: int, level: float) -> tuple[float, float]:
    """Exact two-sided binomial interval for ``k`` successes in ``n`` trials (module docstring)."""
    a = (1.0 - level) / 2.0
    low = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1.0 - a, k + 1, n - k))
    return low, high


def chance_test(
    accuracy: float | None, *, n_eval: int, classes: int, rules: Rules = DEFAULT_RULES
) -> ChanceTest:
    """The state of a run with ``accuracy`` on ``n_eval`` examples of ``classes`` classes.

    ``accuracy`` ``None`` or non-finite (diverged) gives ``failed``. The caller checks
    ``n_eval >= 1`` and ``classes >= 2`` (:func:`fathom.stats.flags.failure_flags` refuses).
    """
    p0 = 1.0 / classes
    p1 = p0 + rules.chance_margin * (1.0 - p0)
    base = {"n_eval": n_eval, "classes": classes, "chance": p0, "boundary": p1}
    if accuracy is None or not math.isfinite(float(accuracy)):
        return ChanceTest(
            state="failed", accuracy=None, low=None, high=None, level=rules.chance_level, **base
        )
    k = min(n_eval, max(0, round(float(accuracy) * n_eval)))
    low, high = clopper_pearson(k, n_eval, rules.chance_level)
    state = "failed" if low <= p0 else "trained" if low > p1 else "undetermined"
    return ChanceTest(
        state=state,
        accuracy=float(accuracy),
        low=low,
        high=high,
        level=rules.chance_level,
        **base,
    )
