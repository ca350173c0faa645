"""Sentences whose numbers used to be missing: the checkpoint ranking and inference speed-ups.

**Ranking between the selected and final checkpoints.** Per metric, the two rankings of the
recipes' means (:func:`fathom.stats.rank_disagreement`) can differ from point estimates
alone. A pair of recipes *swaps* when their order differs between the two checkpoints. A
swap is *established* when the pair's paired difference (the summary's ``comparisons``: each
recipe against the reference, paired over seeds) is established at both checkpoints
(``better`` / ``worse``) in opposite directions. Only pairs holding the reference have a
paired difference in the summary; a swap between two other recipes is therefore never
established here. "The ranking differs" is said only when at least one swap is established;
otherwise the sentence says the difference is not established and counts the metric's
paired differences that are not (``k of N``, both checkpoints).

**Speed-ups.** A mask's time is the median over repeats of its per-repeat forward time
``t_r``; the spread is the interquartile range ``[Q1, Q3]`` of the ``t_r``. The speed-up
of repeat ``r`` is ``dense_r / mask_r`` (the dense network and the mask timed in the same
repeat); the speed-up is their median with the IQR of the per-repeat ratios. A mask is
called faster (slower) only when the whole IQR of its ratio lies above (below) 1; otherwise
the speed-up is not established.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fathom.units import fmt_ratio

ESTABLISHED = ("better", "worse")
SPEEDUP_RULE = (
    "median and interquartile range over repeats; a repeat's speed-up is its dense time over "
    "the mask's, and a mask is called faster or slower only when the IQR of its speed-up "
    "excludes 1"
)
"""The speed-up rule, as the audit page states it above its timing tables."""


def _swapped_pairs(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Pairs ``(a, b)`` ranked in one order at the selected checkpoint and the other at the
    final one (``a`` ahead of ``b`` at the selected checkpoint)."""
    out = []
    for x, y in itertools.combinations(rows, 2):
        sel = x["selected_rank"] - y["selected_rank"]
        fin = x["final_rank"] - y["final_rank"]
        if sel * fin < 0:
            a, b = (x, y) if sel < 0 else (y, x)
            out.append((str(a["name"]), str(b["name"])))
    return out


def ranking_claim(
    ranking: Mapping[str, Any], comparisons: Sequence[Mapping[str, Any]], metric: str
) -> dict[str, Any]:
    """Whether the ranking by ``metric`` is established to differ between the checkpoints
    (module docstring): ``{"differs", "swapped", "established_swaps", "not_established",
    "paired", "sentence"}``; ``sentence`` is ``None`` when the two orders are the same."""
    comps = [c for c in comparisons if c.get("metric") == metric]
    verdict = {(c["recipe"], c["reference"], c["checkpoint"]): c["verdict"] for c in comps}
    swapped = _swapped_pairs(ranking.get("rows") or [])
    established = []
    for a, b in swapped:
        for recipe, ref in ((a, b), (b, a)):
            sel, fin = verdict.get((recipe, ref, "selected")), verdict.get((recipe, ref, "final"))
            if sel in ESTABLISHED and fin in ESTABLISHED and sel != fin:
                established.append(
                    {"recipe": recipe, "reference": ref, "selected": sel, "final": fin}
                )
    missing = sum(c["verdict"] == "not established" for c in comps)
    count = f"{missing} of {len(comps)} paired differences not established"
    label = ranking.get("label", metric)
    if not ranking.get("disagree"):
        sentence = None
    elif established:
        swaps = "; ".join(
            f"{e['recipe']} vs {e['reference']} is {e['selected']} at the selected checkpoint "
            f"and {e['final']} at the final one"
            for e in established
        )
        sentence = (
            f"The ranking by {label} differs between the selected and final checkpoints: "
            f"{swaps} (paired over seeds; {count})."
        )
    else:
        sentence = (
            f"The ranking by {label} is not established to differ between the selected and "
            f"final checkpoints: the recipe means reorder ({len(swapped)} pair(s) swap), but "
            f"no swap has an established paired difference at both checkpoints ({count})."
        )
    return {
        "differs": bool(established),
        "swapped": [list(p) for p in swapped],
        "established_swaps": established,
        "not_established": missing,
        "paired": len(comps),
        "sentence": sentence,
    }


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
