"""The comparison rule: paired over seeds, a resolution floor, a smallest effect of
interest, Holm over the family printed together, and a leave-one-seed-out check.

For arms ``a`` and ``b`` measured on the same seeds ``s = 1..n`` (values on the quantity's
scale: accuracy in pp, CE in nats, a ratio as ``ln``), with measurement variances
``u_s`` of each per-seed value when known::

    d_s      = a_s − b_s
    v_s      = max(u_{a,s} + u_{b,s}, r²)               (r: the quantity's resolution)
    mean     = (1/n) Σ d_s
    se_t     = sd(d) / √n                                 (sample SD, ddof = 1)
    se_floor = √(Σ v_s) / n                               (the measurement's own resolution)
    half(L)  = max(t_{(1+L)/2, n−1} · se_t,  z_{(1+L)/2} · se_floor)
    CI(L)    = mean ± half(L)

(the floor is a known variance, hence its normal quantile), so identical per-seed
differences never give a point interval. With the smallest effect of
interest δ (region ``[−δ, δ]``), read at the interval's level::

    low > δ             a higher   (better / worse by the quantity's direction)
    high < −δ           a lower
    −δ <= low, high <= δ  equivalent
    otherwise           not established        (and always when n < 2)

**Holm.** In a family of ``m`` comparisons with intervals, each gets the claim p-value
``p = min(p_higher, p_lower, p_equivalent)``, the smallest ``1 − L`` at which its interval
supports that claim: with ``P(x) = max(2·sf_t(x / se_t), 2·sf_z(x / se_floor))``,
``p_higher = P(mean − δ)``, ``p_lower = P(−δ − mean)``, ``p_equivalent = P(min(mean + δ, δ − mean))``. Sorted by p, step ``k`` reads its
interval at ``L_k = 1 − (1 − L)/(m − k + 1)``; at the first step whose interval supports no
claim every remaining comparison is read at that step's level (and is not established).

**Fragile.** An established verdict is recomputed leaving each seed out. With ``half`` the
verdict's own half-width (its level) and ``mean₋ₛ`` the estimate without seed ``s``::

    fragile  ⇔  for some s, the interval  mean₋ₛ ± half  no longer gives the verdict

i.e. one seed moves the estimate by at least the verdict's margin beyond the region of no
interest (``low − δ`` for a higher; ``min(low + δ, δ − high)`` for equivalent): that seed
carries the verdict. A leave-one-out estimate on the other side of zero or inside ``[−δ, δ]``
is such a case; that alone never fires, since one seed moves the mean by at most
``se_t`` (``|d_s − mean| <= sd (n−1)/√n``) while ``half >= t·se_t`` (``t > 1.96`` at the
default level). Recomputing with
the ``n − 1`` seeds' own interval would instead mark almost every verdict of 3 seeds fragile
(``t_{0.975, 1} = 12.7``): that count is reported beside the verdict as the measure —
``loo_held``, how many of the ``n`` recomputations (``n − 1`` seeds, their own interval, the
same level) give the same verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

# Student's t and the normal by the functions scipy.stats' ``t`` and ``norm`` evaluate
# (``t.sf(x, d) = stdtr(d, -x)``, ``t.ppf(q, d) = stdtrit(d, q)``, ``norm.sf(x) = ndtr(-x)``,
# ``norm.ppf(q) = ndtri(q)``): the same values, without a frozen distribution per call or
# scipy.stats' import (tests/test_stats_special.py)
from scipy.special import ndtr, ndtri, stdtr, stdtrit

from fathom.stats.results import Comparison, Quantity
from fathom.stats.rules import DEFAULT_RULES, Rules


@dataclass(frozen=True)
class Paired:
    """The inputs of one comparison before its family is judged (see :func:`paired`)."""

    id: str
    quantity: Quantity
    a: str
    b: str
    diffs: dict[int, float] = field(default_factory=dict)
    variances: dict[int, float] = field(default_factory=dict)
    blocked: str | None = None
    context: dict[str, str] = field(default_factory=dict)


def rejudge_input(c: Comparison, cid: str | None = None) -> Paired:
    """The :class:`Paired` a judged comparison was made from (its per-seed numbers), so a
    family can be judged again (Holm over rows printed together, the claim checker)."""
    return Paired(
        c.id if cid is None else cid,
        c.quantity,
        c.a,
        c.b,
        dict(zip(c.seeds, c.diffs)),
        dict(zip(c.seeds, c.variances)),
        blocked=c.reason if c.verdict == "no comparison" else None,
    )


def paired(
    cid: str,
    quantity: Quantity,
    a: Mapping[int, float | None],
    b: Mapping[int, float | None],
    *,
    names: tuple[str, str],
    var_a: Mapping[int, float] | None = None,
    var_b: Mapping[int, float] | None = None,
    blocked: str | None = None,
    context: Mapping[str, str] | None = None,
) -> Paired:
    """Pair ``a[s]`` with ``b[s]``; bad input becomes a ``blocked`` reason, never an error.

    Blocked (``no comparison``): an arm's failure reason ``blocked``; seeds that differ
    between the arms (named); a missing or non-finite value (named); no seed at all.
    """
    na, nb = names
    ctx = dict(context or {})
    if blocked is None:
        blocked = _bad_input(a, b, na, nb)
    if blocked is not None:
        return Paired(cid, quantity, na, nb, blocked=blocked, context=ctx)
    r2 = quantity.resolution**2
    seeds = sorted(a)
    diffs = {s: float(a[s]) - float(b[s]) for s in seeds}  # type: ignore[arg-type]
    var = {s: max((var_a or {}).get(s, 0.0) + (var_b or {}).get(s, 0.0), r2) for s in seeds}
    return Paired(cid, quantity, na, nb, diffs, var, None, ctx)


def _bad_input(
    a: Mapping[int, float | None], b: Mapping[int, float | None], na: str, nb: str
) -> str | None:
    if set(a) != set(b):
        only = ((sorted(set(x) - set(y)), name) for x, y, name in ((a, b, na), (b, a, nb)))
        where = ", ".join(f"seed(s) {seeds} only in {name}" for seeds, name in only if seeds)
        return f"unequal seeds: {where}; a paired comparison needs the same seeds in both arms"
    if not a:
        return f"no seed measured in {na} and {nb}"
    for arm, vals in ((na, a), (nb, b)):
        bad = [s for s, v in sorted(vals.items()) if v is None or not math.isfinite(float(v))]
        if bad:
            return f"{arm} has no finite value at seed(s) {bad}"
    return None


def _stats(diffs: Sequence[float], variances: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, se_t, se_floor)`` of per-seed differences (``se_t`` 0 when n < 2)."""
    n = len(diffs)
    mean = math.fsum(diffs) / n
    floor = math.sqrt(math.fsum(variances)) / n
    if n < 2:
        return mean, 0.0, floor
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in diffs) / (n - 1))
    return mean, sd / math.sqrt(n), floor


def interval(mean: float, se_t: float, floor: float, n: int, level: float) -> tuple[float, float]:
    """``mean ± max(t_{(1+level)/2, n−1} · se_t, z_{(1+level)/2} · se_floor)`` (n >= 2)."""
    q = (1.0 + level) / 2.0
    half = max(float(stdtrit(n - 1, q)) * se_t, float(ndtri(q)) * floor)
    return mean - half, mean + half


def direction_word(sign: int, higher_is_better: bool | None) -> str:
    """``+1`` (a higher) / ``−1`` (a lower) as the quantity's verdict word."""
    if higher_is_better is None:
        return "higher" if sign > 0 else "lower"
    return "better" if (sign > 0) == higher_is_better else "worse"


def verdict_of(
    low: float | None, high: float | None, delta: float, higher_is_better: bool | None
) -> str:
    """The one decision rule: an interval against the region ``[−δ, δ]`` (module docstring)."""
    if low is None or high is None:
        return "not established"
    if low > delta:
        return direction_word(+1, higher_is_better)
    if high < -delta:
        return direction_word(-1, higher_is_better)
    if low >= -delta and high <= delta:
        return "equivalent"
    return "not established"


def _sf(x: float, scale: float, sf: Callable[[float], float]) -> float:
    """``2·sf(x / scale)``; a zero scale gives 0 above zero and 1 at or below it."""
    if scale <= 0.0:
        return 0.0 if x > 0 else 1.0
    return 2.0 * float(sf(x / scale))


def _claim_p(mean: float, se_t: float, floor: float, n: int, delta: float) -> float:
    """Holm's ordering key: the claim p-value (module docstring); 1 when n < 2."""
    if n < 2:
        return 1.0

    def p_of(x: float) -> float:
        return max(_sf(x, se_t, lambda z: stdtr(n - 1, -z)), _sf(x, floor, lambda z: ndtr(-z)))

    return min(1.0, p_of(mean - delta), p_of(-delta - mean), p_of(min(mean + delta, delta - mean)))


def leave_one_out(p: Paired, verdict: str, level: float) -> tuple[bool, list[float], int]:
    """``(fragile, estimates, held)`` of an established verdict (module docstring)."""
    seeds = sorted(p.diffs)
    if len(seeds) < 2:
        return False, [], 0
    q = p.quantity
    mean, se_t, floor = _stats([p.diffs[s] for s in seeds], [p.variances[s] for s in seeds])
    low, _ = interval(mean, se_t, floor, len(seeds), level)
    half = mean - low
    estimates, fragile, held = [], False, 0
    for out in seeds:
        keep = [s for s in seeds if s != out]
        m, se_k, floor_k = _stats([p.diffs[s] for s in keep], [p.variances[s] for s in keep])
        estimates.append(m)
        loo = "not established"
        if len(keep) >= 2:
            loo = verdict_of(
                *interval(m, se_k, floor_k, len(keep), level),
                q.smallest_effect,
                q.higher_is_better,
            )
        held += loo == verdict
        recentred = verdict_of(m - half, m + half, q.smallest_effect, q.higher_is_better)
        fragile = fragile or recentred != verdict
    return fragile, estimates, held


def judge(family: str, items: Sequence[Paired], rules: Rules = DEFAULT_RULES) -> list[Comparison]:
    """Verdicts of a family of comparisons printed together (Holm; module docstring)."""
    alpha = 1.0 - rules.level
    stats = {
        p.id: _stats(list(p.diffs.values()), list(p.variances.values()))
        for p in items
        if p.blocked is None and p.diffs
    }
    tested = [p for p in items if p.id in stats and len(p.diffs) >= 2]
    m = len(tested)
    order = sorted(
        tested,
        key=lambda p: (_claim_p(*stats[p.id], len(p.diffs), p.quantity.smallest_effect), p.id),
    )
    levels: dict[str, tuple[float, int]] = {}
    stopped: float | None = None
    for k, p in enumerate(order, start=1):
        lev = stopped if stopped is not None else 1.0 - alpha / (m - k + 1)
        levels[p.id] = (lev, k)
        if stopped is None:
            mean, se_t, floor = stats[p.id]
            low, high = interval(mean, se_t, floor, len(p.diffs), lev)
            q = p.quantity
            if verdict_of(low, high, q.smallest_effect, q.higher_is_better) == "not established":
                stopped = lev
    return [_one(family, p, stats.get(p.id), levels.get(p.id), m, rules) for p in items]


def _one(
    family: str,
    p: Paired,
    st: tuple[float, float, float] | None,
    lev: tuple[float, int] | None,
    m: int,
    rules: Rules,
) -> Comparison:
    base = {
        "id": p.id,
        "family": family,
        "quantity": p.quantity,
        "a": p.a,
        "b": p.b,
        "nominal_level": rules.level,
        "family_size": m,
        "context": p.context,
    }
    if p.blocked is not None or st is None:
        return Comparison(**base, verdict="no comparison", reason=p.blocked or "no paired seed")
    mean, se_t, floor = st
    n = len(p.diffs)
    seeds = sorted(p.diffs)
    common = {
        **base,
        "n": n,
        "seeds": seeds,
        "estimate": mean,
        "se": se_t,
        "se_floor": floor,
        "diffs": [p.diffs[s] for s in seeds],
        "variances": [p.variances[s] for s in seeds],
    }
    if lev is None:
        return Comparison(
            **common,
            verdict="not established",
            reason=f"n={n} paired seed: an interval needs at least 2",
        )
    level, step = lev
    low, high = interval(mean, se_t, floor, n, level)
    q = p.quantity
    verdict = verdict_of(low, high, q.smallest_effect, q.higher_is_better)
    fragile, loo, held = (False, [], None)
    if verdict != "not established":
        fragile, loo, held = leave_one_out(p, verdict, level)
    return Comparison(
        **common,
        low=low,
        high=high,
        level=level,
        p_claim=_claim_p(mean, se_t, floor, n, q.smallest_effect),
        holm_step=step,
        verdict=verdict,
        reason=_reason(verdict, q.smallest_effect),
        fragile=fragile,
        loo_estimates=loo,
        loo_held=held,
    )


def _reason(verdict: str, delta: float) -> str:
    if verdict == "equivalent":
        return f"the interval lies inside [-{delta:g}, +{delta:g}]"
    if verdict == "not established":
        return f"the interval is neither outside nor inside [-{delta:g}, +{delta:g}]"
    return f"the interval lies outside [-{delta:g}, +{delta:g}]"
