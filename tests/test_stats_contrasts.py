"""Directional contrasts (higher / lower / equivalent / not established / no comparison)
against hand-computed intervals with the resolution floor, and their sentences."""

import math

import pytest
from scipy import stats as scipy_stats

from fathom.errors import FathomError
from fathom.stats.claims import check
from fathom.stats.contrasts import contrast, contrast_sentence
from fathom.stats.results import Claim, Results, Sentence

Z = scipy_stats.norm.ppf(0.975)
T2 = scipy_stats.t.ppf(0.975, 2)


def _log_interval(ratios, floor=1e-3):
    """Geometric-mean ratio and its 95% interval by hand (n = 3): max of t and floor halves."""
    logs = [math.log(r) for r in ratios]
    m = sum(logs) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 2)
    half = max(T2 * sd / math.sqrt(3), Z * math.sqrt(3 * floor**2) / 3)
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def test_ratio_lower_hand_computed():
    a = {1: 0.50, 2: 0.90, 3: 1.10}
    b = {1: 1.00, 2: 2.00, 3: 2.00}  # ratios 0.5, 0.45, 0.55
    c = contrast(a, b, scale="ratio", name_a="plain", name_b="residual")
    est, lo, hi = _log_interval([0.5, 0.45, 0.55])
    assert c.verdict == "lower" and c.n == 3
    assert (c.estimate, c.low, c.high) == pytest.approx((est, lo, hi), rel=1e-12)
    s = contrast_sentence(
        c, name_a="plain", name_b="residual", quantity="head-layer ‖mean g‖", epoch=5
    )
    assert s.startswith(
        f"plain vs residual on head-layer ‖mean g‖ (epoch 5): lower (ratio {est:.3g}×"
    )
    assert f"[{lo:.3g}×, {hi:.3g}×]" in s and "[0.952×, 1.05×]" in s
    _checked(c, s)


def _checked(c, text):
    cmp = c.comparison
    res = Results(
        comparisons=[cmp],
        sentences=[
            Sentence(
                text=text,
                claims=[Claim(comparison=cmp.id, verdict=cmp.verdict, fragile=cmp.fragile)],
            )
        ],
    )
    assert check(res) == []


def test_ratio_interval_covering_one_is_not_established():
    a, b = {1: 2.0, 2: 4.0, 3: 1.0}, {1: 4.0, 2: 8.0, 3: 4.0}  # ratios 0.5, 0.5, 0.25
    c = contrast(a, b, scale="ratio")
    est, lo, hi = _log_interval([0.5, 0.5, 0.25])
    assert est == pytest.approx(0.0625 ** (1 / 3))
    assert (c.low, c.high) == pytest.approx((lo, hi)) and lo < 1 < hi
    assert c.verdict == "not established"
    s = contrast_sentence(c, name_a="a", name_b="b", quantity="D", epoch=1)
    assert "not established" in s and "lower" not in s
    _checked(c, s)


def test_identical_ratios_are_no_point_interval_and_a_tiny_ratio_is_no_direction():
    # once printed "higher … ratio 1 [1, 1]": a real ratio of 1.001 on every seed
    c = contrast({1: 1.001, 2: 1.001, 3: 1.001}, {1: 1.0, 2: 1.0, 3: 1.0}, scale="ratio")
    assert c.high > c.low
    assert c.verdict == "equivalent"
    s = contrast_sentence(c, name_a="a", name_b="b", quantity="norm", epoch=3)
    assert "higher" not in s and "1×" in s
    _checked(c, s)


def test_difference_in_percentage_points_higher():
    c = contrast({1: 0.30, 2: 0.32, 3: 0.35}, {1: 0.10, 2: 0.11, 3: 0.12}, scale="difference")
    d = [20.0, 21.0, 23.0]
    m = sum(d) / 3
    half = T2 * math.sqrt(sum((x - m) ** 2 for x in d) / 2) / math.sqrt(3)
    assert c.verdict == "higher"
    assert (c.estimate, c.low, c.high) == pytest.approx((m, m - half, m + half), abs=1e-9)
    s = contrast_sentence(c, name_a="plain", name_b="residual", quantity="zero fraction", epoch=5)
    assert s.startswith(
        "plain vs residual on zero fraction (epoch 5): higher (difference +21.33 pp"
    )
    _checked(c, s)


def test_one_seed_claims_nothing():
    c = contrast({1: 0.1}, {1: 1.0}, scale="ratio")
    assert c.verdict == "not established" and c.n == 1 and c.low is None
    assert c.estimate == pytest.approx(0.1)
    s = contrast_sentence(c, name_a="a", name_b="b", quantity="q", epoch=0)
    assert "no interval" in s and "lower" not in s


def test_flags_exclude_and_are_named():
    a, b = {1: 0.1, 2: 0.1, 3: 0.1}, {1: 1.0, 2: 1.1, 3: 0.9}
    c = contrast(a, b, scale="ratio", flags_a=["diverged"], name_a="plain", name_b="residual")
    assert c.verdict == "no comparison" and c.estimate is None
    s = contrast_sentence(c, name_a="plain", name_b="residual", quantity="q", epoch=5)
    assert s == "plain vs residual on q (epoch 5): no comparison (plain excluded (diverged))."
    assert contrast(a, b, scale="ratio", flags_b=["not_fitting"]).verdict == "lower"


def test_bad_input_is_no_comparison():
    c = contrast({1: 0.0, 2: 1.0}, {1: 1.0, 2: 1.0}, scale="ratio")
    assert c.verdict == "no comparison" and "no ratio" in c.reason
    assert contrast({1: 0.0, 2: 0.1}, {1: 0.1, 2: 0.1}, scale="difference").n == 2
    c = contrast({1: 1.0}, {2: 1.0}, scale="ratio", name_a="x", name_b="y")
    assert c.verdict == "no comparison" and "no seed measured in both x and y" in c.reason
    c = contrast({1: 0.1}, {1: 1.0, 2: 1.0}, scale="ratio", name_a="x", name_b="y")
    assert c.verdict == "no comparison" and "unequal seeds" in c.reason
    with pytest.raises(FathomError, match="scale"):
        contrast({1: 1.0}, {1: 1.0}, scale="log")
