"""Rankings of point estimates and first crossings (comparison verdicts:
tests/test_stats_inference.py, test_stats_summary.py, test_stats_scaling.py)."""

import pytest

from fathom.errors import FathomError
from fathom.stats.verdicts import first_crossing, rank_disagreement


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
