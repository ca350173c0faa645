"""Seed aggregation: mean, sample SD and Student-t intervals, plain or paired by seed.

For n values x_1..x_n (one per seed)::

    mean  = (1/n) Σ x_i
    sd    = sqrt( Σ (x_i - mean)² / (n - 1) )                     (sample SD, ddof = 1)
    CI    = mean ± t_{(1+level)/2, n-1} · sd / sqrt(n)              (Student t, n - 1 dof)

A paired difference uses d_s = a_s - b_s over the seeds s present in both arms and
gives the same interval on the d_s. With n < 2 there is no SD and no interval: they
are ``None``, never 0. Three-seed intervals are descriptive and uncorrected for
multiple comparisons; say so wherever they are printed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

# scipy.stats' t.ppf(q, d) is stdtrit(d, q) (see fathom.stats.inference)
from scipy.special import stdtrit

from fathom.errors import FathomError


@dataclass(frozen=True)
class Interval:
    """A point estimate over ``n`` seeds with its two-sided interval at ``level``.

    ``low`` and ``high`` are ``None`` when ``n < 2`` (no interval can be formed);
    ``method`` names the estimator (``"t"`` or ``"paired t"``).
    """

    estimate: float
    low: float | None
    high: float | None
    n: int
    level: float
    method: str

    @property
    def has_interval(self) -> bool:
        """True when ``low`` and ``high`` are defined (n >= 2)."""
        return self.low is not None and self.high is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; undefined bounds are ``None``."""
        return asdict(self)


def _finite_values(values: Iterable[float], what: str) -> list[float]:
    out = []
    for i, v in enumerate(values):
        if v is None or not math.isfinite(float(v)):
            raise FathomError(
                f"{what}: value #{i} is {v!r}, not a finite number; drop runs flagged "
                "'diverged' or missing this metric before aggregating (see fathom.stats.flags)"
            )
        out.append(float(v))
    return out


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise FathomError(f"interval level {level!r} is outside (0, 1); use e.g. 0.95")


def mean_sd(values: Iterable[float]) -> tuple[float | None, float | None, int]:
    """``(mean, sample SD with ddof=1, n)``; mean is ``None`` for n = 0, SD for n < 2."""
    xs = _finite_values(values, "mean_sd")
    n = len(xs)
    if n == 0:
        return None, None, 0
    mean = math.fsum(xs) / n
    if n < 2:
        return mean, None, n
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    return mean, math.sqrt(var), n


def _t_critical(level: float, dof: int) -> float:
    """Two-sided Student-t critical value ``t_{(1+level)/2, dof}``."""
    _check_level(level)
    return float(stdtrit(dof, (1.0 + level) / 2.0))


def _t_interval(xs: list[float], level: float, method: str) -> Interval:
    mean, sd, n = mean_sd(xs)
    if mean is None:
        raise FathomError(f"{method} interval of zero values; there must be at least one seed")
    if sd is None:
        return Interval(mean, None, None, n, level, method)
    half = _t_critical(level, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, level, method)


def t_interval(values: Iterable[float], level: float = 0.95) -> Interval:
    """Mean of ``values`` with the Student-t interval ``mean ± t·sd/√n`` (n >= 2)."""
    _check_level(level)
    return _t_interval(_finite_values(values, "t_interval"), level, "t")


def paired_difference(
    a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95
) -> Interval:
    """Mean of ``a[s] - b[s]`` over the seeds ``s`` in both maps, with a paired t interval.

    Seeds present in only one arm are ignored (``n`` counts the common seeds); no
    common seed is an error.
    """
    _check_level(level)
    common = sorted(set(a) & set(b))
    if not common:
        raise FathomError(
            f"paired difference: no common seeds (a has {sorted(a)}, b has {sorted(b)}); "
            "pair runs that share seeds"
        )
    da = _finite_values((a[s] for s in common), "paired_difference (a)")
    db = _finite_values((b[s] for s in common), "paired_difference (b)")
    return _t_interval([x - y for x, y in zip(da, db)], level, "paired t")
