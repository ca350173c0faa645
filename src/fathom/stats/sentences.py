"""Sentences about comparisons: composed here only, each with the claims it makes.

A comparison's sentence (:func:`comparison_sentence`) names both arms, the quantity, the
verdict, the estimate, the interval with its (Holm-adjusted) level, n and the region of no
interest; ``fragile`` is printed beside an established verdict that one seed carries
(:func:`fathom.stats.inference.leave_one_out`), with how many leave-one-seed-out
recomputations keep it. :func:`family_note` says how the family printed together was corrected.
"""

from __future__ import annotations

from collections.abc import Sequence

from fathom.base.units import fmt_level
from fathom.stats.numbers import fmt_estimate, fmt_interval, fmt_region
from fathom.stats.results import Claim, Comparison, Sentence


def verdict_words(c: Comparison) -> str:
    """``better``, ``better, fragile``, ``not established``, ... (the printed verdict)."""
    return f"{c.verdict}, fragile" if c.fragile else c.verdict


def _scope(c: Comparison) -> str:
    scope = c.context.get("scope")
    return f" ({scope})" if scope else ""


def comparison_text(c: Comparison) -> str:
    """The body after the verdict: numbers, interval, level, n, region (or the reason)."""
    if c.verdict == "no comparison":
        return c.reason
    est = (
        f"difference {fmt_estimate(c)}"
        if c.quantity.scale != "log ratio"
        else (f"ratio {fmt_estimate(c)}")
    )
    if c.low is None:
        return f"{est}; n={c.n} paired seed(s): no interval"
    holm = f", Holm step {c.holm_step} of {c.family_size}" if c.family_size > 1 else ""
    where = {"not established": "neither outside nor inside", "equivalent": "inside"}.get(
        c.verdict, "outside"
    )
    loo = (
        ""
        if c.loo_held is None
        else (
            f"; {c.loo_held} of {c.n} leave-one-seed-out recomputations "
            f"({c.n - 1} seeds, their own interval) keep the verdict"
        )
    )
    return (
        f"{est}, {fmt_level(c.level)} interval {fmt_interval(c)}, paired over n={c.n} seeds"
        f"{holm}; {where} the region of no interest {fmt_region(c)}{loo}"
    )


def comparison_sentence(c: Comparison) -> Sentence:
    """``"plain vs residual on test accuracy (selected checkpoint): worse (difference ...)."``"""
    caveat = f"; {c.context['caveat']}" if c.context.get("caveat") else ""
    text = (
        f"{c.a} vs {c.b} on {c.quantity.name}{_scope(c)}: {verdict_words(c)} "
        f"({comparison_text(c)}{caveat})."
    )
    return Sentence(
        text=text, claims=[Claim(comparison=c.id, verdict=c.verdict, fragile=c.fragile)]
    )


def family_note(comparisons: Sequence[Comparison], level: float) -> str:
    """How the family printed together was corrected (stated next to it)."""
    m = max((c.family_size for c in comparisons), default=0)
    if m <= 1:
        return (
            f"{fmt_level(level)} intervals paired over seeds; one comparison with an interval, "
            "no multiplicity correction needed; n < 2 gives no interval."
        )
    return (
        f"Holm-corrected over the {m} comparisons with an interval printed together "
        f"(nominal {fmt_level(level)}; each interval is printed at the level of its Holm step); "
        "n < 2 gives no interval."
    )


def rest_note(n: int) -> str:
    """The line standing for the contrasts a headline does not list."""
    return (
        f"{n} other contrast(s): not established, or at an earlier epoch "
        "(every sentence in summary.json)."
    )


def undecided_note(n: int, what: str, detail: str = "") -> str:
    """The line standing for ``n`` sentences whose every verdict is not established (collapsed
    in the report until opened); ``detail`` follows the count, e.g. the ratio direction."""
    return f"{n} {what} not established{detail}."
