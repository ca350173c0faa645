"""The speed-up sentence carries its evidence: a speed-up is called faster/slower only when
the IQR of its per-repeat ratios excludes 1 (the checkpoint ranking: test_stats_ranking.py)."""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.stats.sentences_repro import iqr, speedup_claim, speedup_sentence


def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolation quantile, written out (the brute-force reference)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


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
