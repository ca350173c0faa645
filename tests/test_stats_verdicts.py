"""The verdict engine on adversarial comparisons (depth scaling: test_stats_scaling.py)."""

import math

import pytest

from fathom.errors import FathomError
from fathom.stats.flags import failure_flags
from fathom.stats.intervals import Interval, paired_difference
from fathom.stats.verdicts import (
    compare,
    first_crossing,
    rank_disagreement,
    verdict_sentence,
)


def _iv(est, low, high, n=3):
    return Interval(est, low, high, n, 0.95, "paired t")


@pytest.mark.parametrize(
    ("diff", "higher_is_better", "expected"),
    [
        pytest.param(_iv(0.01, 0.004, 0.016), True, "better", id="above-zero-higher-better"),
        pytest.param(_iv(0.01, 0.004, 0.016), False, "worse", id="above-zero-lower-better"),
        pytest.param(_iv(-0.01, -0.02, -0.001), True, "worse", id="below-zero-higher-better"),
        pytest.param(_iv(-0.01, -0.02, -0.001), False, "better", id="below-zero-lower-better"),
        pytest.param(_iv(0.01, -0.002, 0.02), True, "not established", id="crossing-zero"),
        pytest.param(
            Interval(0.05, None, None, 1, 0.95, "paired t"), True, "not established", id="n1"
        ),
    ],
)
def test_compare_reads_the_interval(diff, higher_is_better, expected):
    v = compare(diff, higher_is_better=higher_is_better, flags_a=[], flags_b=[])
    assert v.verdict == expected


def test_interval_crossing_zero_sentence_makes_no_claim():
    a = {101: 0.981, 102: 0.975, 103: 0.979}
    b = {101: 0.978, 102: 0.977, 103: 0.976}
    diff = paired_difference(a, b)
    assert diff.low < 0 < diff.high
    v = compare(diff, higher_is_better=True, flags_a=[], flags_b=[])
    text = verdict_sentence(v, name_a="sd", name_b="plain", metric="test accuracy")
    assert v.verdict == "not established"
    assert text.startswith("sd vs plain on test accuracy: not established")
    assert "includes zero" in text
    assert "better" not in text


def test_n1_sentence_says_no_interval():
    diff = paired_difference({1: 0.9}, {1: 0.8})
    v = compare(diff, higher_is_better=True, flags_a=[], flags_b=[])
    text = verdict_sentence(v, name_a="x", name_b="y", metric="acc")
    assert v.verdict == "not established"
    assert "no interval" in text


def test_diverged_arm_is_excluded_and_listed():
    flags_b = failure_flags(
        status="diverged", test_acc=math.nan, train_ce=None, classes=10, n_eval=10_000
    )
    v = compare(
        None, higher_is_better=True, flags_a=[], flags_b=flags_b, name_a="sd", name_b="plain"
    )
    assert v.verdict == "no comparison"
    assert "plain excluded (diverged)" in v.reason
    text = verdict_sentence(v, name_a="sd", name_b="plain", metric="test accuracy")
    assert "better" not in text and "worse" not in text
    assert "plain excluded (diverged)" in text


def test_all_arms_at_chance_make_no_claim():
    # Both arms at 10% on a 10-class problem, yet one is "significantly" higher.
    a = {1: 0.102, 2: 0.103, 3: 0.104}
    b = {1: 0.098, 2: 0.097, 3: 0.099}
    fa = failure_flags(status="complete", test_acc=0.103, train_ce=2.30, classes=10, n_eval=10_000)
    fb = failure_flags(status="complete", test_acc=0.098, train_ce=2.31, classes=10, n_eval=10_000)
    diff = paired_difference(a, b)
    assert diff.low > 0
    v = compare(diff, higher_is_better=True, flags_a=fa, flags_b=fb, name_a="a", name_b="b")
    assert v.verdict == "no comparison"
    assert "a excluded (at_chance)" in v.reason and "b excluded (at_chance)" in v.reason


def test_better_sentence_states_interval_and_not_fitting_caveat():
    diff = paired_difference({1: 0.5, 2: 0.52, 3: 0.51}, {1: 0.4, 2: 0.41, 3: 0.43})
    v = compare(diff, higher_is_better=True, flags_a=["not_fitting"], flags_b=[], name_a="a")
    text = verdict_sentence(v, name_a="a", name_b="b", metric="test accuracy")
    assert v.verdict == "better"
    assert "95% paired t interval [" in text and "n=3" in text
    assert "caveat: a not fitting" in text


def test_compare_without_interval_for_valid_arms_is_refused():
    with pytest.raises(FathomError, match="paired_difference"):
        compare(None, higher_is_better=True, flags_a=[], flags_b=[])


def test_selected_vs_final_disagreement_is_shown():
    selected = {"plain": 0.981, "sd-constant": 0.983, "residual": 0.980}
    final = {"plain": 0.984, "sd-constant": 0.982, "residual": 0.983}
    r = rank_disagreement(selected, final)
    assert r.disagree
    assert r.selected_order == ["sd-constant", "plain", "residual"]
    assert r.final_order == ["plain", "residual", "sd-constant"]
    row = next(x for x in r.rows if x["name"] == "sd-constant")
    assert (row["selected_rank"], row["final_rank"]) == (1, 3)
    assert not rank_disagreement(selected, selected).disagree
    # lower-is-better (CE) reverses the order
    assert rank_disagreement(
        {"a": 0.1, "b": 0.2}, {"a": 0.1, "b": 0.2}, higher_is_better=False
    ).selected_order == ["a", "b"]
    with pytest.raises(FathomError, match="arms differ"):
        rank_disagreement({"a": 1.0}, {"b": 1.0})


def test_first_crossing_first_observed_time():
    times = [0.0, 10.0, 20.0, 30.0]
    assert first_crossing(times, [0.1, None, 0.97, 0.99], 0.97) == 20.0
    assert first_crossing(times, [0.1, 0.5, 0.6, 0.7], 0.97) is None
    with pytest.raises(FathomError, match="one time per value"):
        first_crossing([0.0], [0.1, 0.2], 0.5)
    with pytest.raises(FathomError, match="decrease"):
        first_crossing([1.0, 0.0], [0.1, 0.2], 0.5)
