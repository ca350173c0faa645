"""Sentences whose numbers used to be missing: inference speed-ups (the checkpoint ranking
is :mod:`fathom.stats.ranking`).

**Speed-ups.** A mask's time is the median over repeats of its per-repeat forward time
``t_r``; the spread is the interquartile range ``[Q1, Q3]`` of the ``t_r``. The speed-up
of repeat ``r`` is ``dense_r / mask_r`` (the dense network and the mask timed in the same
repeat); the speed-up is their median with the IQR of the per-repeat ratios. A mask is
called faster (slower) only when the whole IQR of its ratio lies above (below) 1; otherwise
the speed-up is not established.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fathom.base.units import fmt_ratio

SPEEDUP_RULE = (
    "median and interquartile range over repeats; a repeat's speed-up is its dense time over "
    "the mask's, and a mask is called faster or slower only when the IQR of its speed-up "
    "excludes 1"
)
"""The speed-up rule, as the audit page states it above its timing tables."""


def iqr(values: Sequence[float]) -> tuple[float, float, float]:
    """``(median, Q1, Q3)`` of ``values`` (numpy's linear quantiles)."""
    q1, med, q3 = np.quantile(np.asarray(values, dtype=float), [0.25, 0.5, 0.75])
    return float(med), float(q1), float(q3)


def speedup_claim(ratios: Sequence[float]) -> dict[str, Any]:
    """``{"median", "q1", "q3", "repeats", "verdict"}`` of per-repeat speed-ups
    ``dense_r / mask_r``: ``faster`` when ``Q1 > 1``, ``slower`` when ``Q3 < 1``, else
    ``not established`` (also for fewer than two repeats: no spread)."""
    med, q1, q3 = iqr(ratios)
    if len(ratios) < 2:
        verdict = "not established"
    elif q1 > 1:
        verdict = "faster"
    elif q3 < 1:
        verdict = "slower"
    else:
        verdict = "not established"
    return {"median": med, "q1": q1, "q3": q3, "repeats": len(ratios), "verdict": verdict}


def speedup_sentence(subject: str, claim: Mapping[str, Any]) -> str:
    """``"mask 1010: faster than dense, speed-up 1.84× (IQR 1.71×–1.95× over 7 repeats)."``
    (``subject``: what was timed against the dense network, e.g. ``"mask 1010"``)."""
    spread = (
        f"speed-up {fmt_ratio(claim['median'])} (IQR {fmt_ratio(claim['q1'])}–"
        f"{fmt_ratio(claim['q3'])} over "
    )
    spread += f"{claim['repeats']} repeat{'s' if claim['repeats'] != 1 else ''})"
    if claim["verdict"] in ("faster", "slower"):
        return f"{subject}: {claim['verdict']} than dense, {spread}."
    why = "one repeat: no spread" if claim["repeats"] < 2 else "the IQR includes 1"
    return f"{subject}: speed-up not established, {spread}; {why}."
