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

from fathom.stats.rules import DEFAULT_RULES, Rules


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
    # scipy.stats' beta.ppf(q, a, b) is betaincinv(a, b, q): the same values without a
    # distribution object or scipy.stats' import (tests/test_stats_special.py); still imported
    # only where an interval is shown
    from scipy.special import betaincinv

    a = (1.0 - level) / 2.0
    low = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, a))
    high = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1.0 - a))
    return low, high


def binomial_upper_tail(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``, ``0 < p < 1``, exactly in float64 without
    scipy: ``Σ_{j=k}^{n} C(n, j) p^j (1 − p)^(n − j)``, the terms in log space
    (``log t_{j+1} = log t_j + log((n − j) / (j + 1)) + log(p / (1 − p))``) summed with
    their largest factored out; terms 60 nats below it past the mode are negligible (< e⁻⁶⁰
    relative each, far below float64's resolution of the sum) and end the sum."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    odds = math.log(p) - math.log1p(-p)
    lt = (
        math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        + k * math.log(p) + (n - k) * math.log1p(-p)
    )  # fmt: skip
    logs = [lt]
    top = lt
    for j in range(k, n):
        lt += math.log((n - j) / (j + 1)) + odds
        top = max(top, lt)
        logs.append(lt)
        if lt < top - 60.0 and j + 1 > n * p:
            break
    return math.exp(top) * math.fsum(math.exp(x - top) for x in logs)


def chance_state(k: int, n: int, p0: float, p1: float, level: float) -> str:
    """The state of ``k`` correct of ``n`` against chance ``p0`` and the boundary ``p1``, by
    the Clopper–Pearson lower bound ``low`` (module docstring) without computing it: the
    upper tail ``P(X >= k; p)`` rises with ``p`` and equals ``a = (1 − L)/2`` at ``p = low``,
    so ``low <= p0`` iff ``P(X >= k; p0) >= a`` (failed) and ``low > p1`` iff
    ``P(X >= k; p1) < a`` (trained). The one rule :func:`chance_test` and
    :func:`fathom.stats.flags.failure_flags` decide by (no scipy: a command's last line is
    not followed by a second of imports)."""
    a = (1.0 - level) / 2.0
    if k == 0 or binomial_upper_tail(k, n, p0) >= a:
        return "failed"
    return "trained" if binomial_upper_tail(k, n, p1) < a else "undetermined"


def chance_and_boundary(classes: int, rules: Rules = DEFAULT_RULES) -> tuple[float, float]:
    """``(p₀, p₁)``: chance ``1/C`` and the trained boundary ``p₀ + m (1 − p₀)``."""
    p0 = 1.0 / classes
    return p0, p0 + rules.chance_margin * (1.0 - p0)


def correct(accuracy: float, n_eval: int) -> int:
    """``k = round(a N)``, within ``[0, N]``: the correct answers behind an accuracy."""
    return min(n_eval, max(0, round(float(accuracy) * n_eval)))


def accuracy_state(
    accuracy: float | None, *, n_eval: int, classes: int, rules: Rules = DEFAULT_RULES
) -> str:
    """:func:`chance_test`'s ``state`` alone, without the interval's numbers (no scipy):
    ``failed`` for no finite accuracy, else :func:`chance_state`."""
    if accuracy is None or not math.isfinite(float(accuracy)):
        return "failed"
    p0, p1 = chance_and_boundary(classes, rules)
    return chance_state(correct(accuracy, n_eval), n_eval, p0, p1, rules.chance_level)


def chance_test(
    accuracy: float | None, *, n_eval: int, classes: int, rules: Rules = DEFAULT_RULES
) -> ChanceTest:
    """The state of a run with ``accuracy`` on ``n_eval`` examples of ``classes`` classes.

    ``accuracy`` ``None`` or non-finite (diverged) gives ``failed``. The caller checks
    ``n_eval >= 1`` and ``classes >= 2`` (:func:`fathom.stats.flags.failure_flags` refuses).
    """
    p0, p1 = chance_and_boundary(classes, rules)
    base = {"n_eval": n_eval, "classes": classes, "chance": p0, "boundary": p1}
    if accuracy is None or not math.isfinite(float(accuracy)):
        return ChanceTest(
            state="failed", accuracy=None, low=None, high=None, level=rules.chance_level, **base
        )
    low, high = clopper_pearson(correct(accuracy, n_eval), n_eval, rules.chance_level)
    state = accuracy_state(accuracy, n_eval=n_eval, classes=classes, rules=rules)
    return ChanceTest(
        state=state,
        accuracy=float(accuracy),
        low=low,
        high=high,
        level=rules.chance_level,
        **base,
    )
