"""The checkpoint-ranking sentence and the speed-up sentence carry their evidence: "the ranking
differs" only when a swapped pair's paired differences are established in opposite directions
at both checkpoints (else the count of differences not established), and a speed-up is
called faster/slower only when the IQR of its per-repeat ratios excludes 1."""

from __future__ import annotations

import itertools
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.stats.sentences_repro import (
    iqr,
    ranking_claim,
    speedup_claim,
    speedup_sentence,
)
from fathom.stats.verdicts import rank_disagreement

VERDICTS = ("better", "worse", "not established")
RECIPES = ("residual", "a", "b", "c")


def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolation quantile, written out (the brute-force reference)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


@st.composite
def study(draw):
    sel = {r: draw(st.floats(0.5, 1.0)) for r in RECIPES}
    fin = {r: draw(st.floats(0.5, 1.0)) for r in RECIPES}
    verdicts = {
        (r, w): draw(st.sampled_from(VERDICTS)) for r in RECIPES[1:] for w in ("selected", "final")
    }
    return sel, fin, verdicts


def _claim(sel, fin, verdicts):
    rk = {"label": "test accuracy", **rank_disagreement(sel, fin).to_dict()}
    comps = [
        {"recipe": r, "reference": "residual", "checkpoint": w, "metric": "test_acc", "verdict": v}
        for (r, w), v in verdicts.items()
    ]
    return rk, ranking_claim(rk, comps, "test_acc")


@settings(max_examples=200, deadline=None)
@given(study())
@example(  # the quick study: residual and sd_decreasing swap, nothing established at final
    (
        {"residual": 0.9268, "a": 0.9236, "b": 0.9208, "c": 0.9145},
        {"residual": 0.9222, "a": 0.9233, "b": 0.9188, "c": 0.9125},
        {
            ("a", "selected"): "not established",
            ("a", "final"): "not established",
            ("b", "selected"): "not established",
            ("b", "final"): "not established",
            ("c", "selected"): "worse",
            ("c", "final"): "not established",
        },
    )
)
def test_ranking_differs_only_with_an_established_opposite_swap(case):
    sel, fin, verdicts = case
    _, claim = _claim(sel, fin, verdicts)
    order = lambda v: sorted(v, key=lambda n: (-v[n], n))  # noqa: E731
    so, fo = order(sel), order(fin)
    swaps = [
        (x, y)
        for x, y in itertools.combinations(RECIPES, 2)
        if (so.index(x) - so.index(y)) * (fo.index(x) - fo.index(y)) < 0
    ]
    assert sorted(map(sorted, claim["swapped"])) == sorted(map(sorted, swaps))
    want = any(
        "residual" in p
        and (r := p[0] if p[1] == "residual" else p[1])
        and {verdicts[(r, "selected")], verdicts[(r, "final")]} == {"better", "worse"}
        for p in swaps
    )
    assert claim["differs"] == want
    missing = sum(v == "not established" for v in verdicts.values())
    assert claim["not_established"] == missing and claim["paired"] == 6
    if so == fo:
        assert claim["sentence"] is None
    elif want:
        assert claim["sentence"].startswith("The ranking by test accuracy differs between")
    else:
        assert "is not established to differ" in claim["sentence"]
        assert f"({missing} of 6 paired differences not established)" in claim["sentence"]


ratios = st.lists(st.floats(0.2, 5.0, allow_nan=False), min_size=1, max_size=9)


@settings(max_examples=200, deadline=None)
@given(ratios)
@example([1.61])  # one repeat: no spread, never a speed-up
@example([0.9, 1.2, 1.3, 1.4])  # median above 1, IQR reaching below it
def test_speedup_is_called_only_when_its_iqr_excludes_one(rs):
    c = speedup_claim(rs)
    q1, q3 = _quantile(rs, 0.25), _quantile(rs, 0.75)
    assert math.isclose(c["q1"], q1, abs_tol=1e-12) and math.isclose(c["q3"], q3, abs_tol=1e-12)
    assert math.isclose(c["median"], _quantile(rs, 0.5), abs_tol=1e-12)
    want = "not established"
    if len(rs) >= 2 and q1 > 1:
        want = "faster"
    elif len(rs) >= 2 and q3 < 1:
        want = "slower"
    assert c["verdict"] == want
    s = speedup_sentence("mask 1010", c)
    assert f"over {len(rs)} repeat" in s and "IQR" in s
    assert ("faster than dense" in s) == (want == "faster")
    assert ("slower than dense" in s) == (want == "slower")
    assert iqr(rs)[0] == c["median"]
