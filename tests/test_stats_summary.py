"""Study summary on small hand-made run records."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from fathom.errors import FathomError
from fathom.stats.summary import RunRecord, summarise_study, to_markdown

FINGERPRINT = {"dataset": "mnist", "epochs": 100, "batch": 64, "widths": [2500, 2000]}


def _record(recipe, seed, sel_acc, fin_acc, *, status="complete", train_s=100.0, curve=None, **kw):
    return RunRecord(
        recipe=recipe,
        seed=seed,
        lr=0.01,
        status=status,
        classes=10,
        selected={"test_acc": sel_acc, "test_ce": 1.0 - sel_acc, "val_ce": 0.1, "epoch": 50},
        final={"test_acc": fin_acc, "test_ce": 1.0 - fin_acc, "val_ce": 0.2, "epoch": 100},
        fit_acc_final=kw.pop("fit_acc", 1.0),
        training_clock_s=train_s,
        elapsed_s=train_s * 1.5,
        curve=curve or [(0, 0.0, 0.0, 0.1), (5, 10.0, 15.0, 0.96), (10, 20.0, 30.0, 0.98)],
        config_fingerprint=kw.pop("fingerprint", FINGERPRINT),
        fit_ce_final=0.01,
    )


def _study():
    return [
        _record("plain", 101, 0.981, 0.984, train_s=100.0),
        _record("plain", 102, 0.975, 0.983, train_s=102.0),
        _record("plain", 103, 0.979, 0.985, train_s=98.0),
        # sd: better at the selected checkpoint, worse at final: rankings disagree
        _record("sd", 101, 0.990, 0.980, train_s=70.0),
        _record("sd", 102, 0.989, 0.979, train_s=72.0),
        _record("sd", 103, 0.991, 0.981, train_s=69.0),
        # residual: one diverged seed, excluded and listed
        _record("residual", 101, 0.980, 0.982),
        _record("residual", 102, math.nan, math.nan, status="diverged"),
        _record("residual", 103, 0.979, 0.983),
    ]


def test_summary_tables_differences_and_verdicts():
    s = summarise_study(_study(), reference="plain", target_val_acc=0.97)
    json.dumps(s)  # JSON-able
    plain = s["recipes"]["plain"]["selected"]["test_acc"]
    assert plain["mean"] == pytest.approx(np.mean([0.981, 0.975, 0.979]))
    assert plain["sd"] == pytest.approx(np.std([0.981, 0.975, 0.979], ddof=1))
    assert plain["n"] == 3

    by = {(c["recipe"], c["metric"], c["checkpoint"]): c for c in s["comparisons"]}
    sel = by[("sd", "test_acc", "selected")]
    # accuracy differences are in percentage points
    ref = stats.ttest_rel([99.0, 98.9, 99.1], [98.1, 97.5, 97.9]).confidence_interval()
    assert sel["unit"] == "percentage points"
    assert sel["diff"]["low"] == pytest.approx(ref.low)
    assert sel["diff"]["high"] == pytest.approx(ref.high)
    assert "in percentage points" in sel["sentence"]
    assert sel["verdict"] == "better"
    assert by[("sd", "test_acc", "final")]["verdict"] == "worse"
    assert by[("sd", "test_ce", "final")]["verdict"] == "worse"  # CE: lower is better

    res = by[("residual", "test_acc", "selected")]
    assert res["verdict"] == "no comparison"
    assert "residual excluded (diverged)" in res["sentence"]
    assert s["excluded"] == [{"recipe": "residual", "seed": 102, "flags": ["diverged"]}]
    assert s["recipes"]["residual"]["selected"]["test_acc"]["n"] == 2

    rk = s["rankings"]["test_acc"]
    assert rk["disagree"]
    assert rk["selected_order"] == ["sd", "plain"] and rk["final_order"] == ["plain", "sd"]

    ratio = s["recipes"]["sd"]["training_ratio_to_reference"]
    assert ratio["ratio_of_means"] == pytest.approx(np.mean([70, 72, 69]) / 100.0)
    assert ratio["paired_ratio"]["estimate"] == pytest.approx(np.mean([0.70, 72 / 102, 69 / 98]))

    ttt = s["recipes"]["plain"]["time_to_target"]
    assert ttt["reached"] == 3
    assert ttt["training_s"]["mean"] == 20.0 and ttt["elapsed_s"]["mean"] == 30.0
    assert any("every 5 epoch(s) bounds its precision" in n for n in s["notes"])

    md = to_markdown(s)
    assert "| Method | LR | Validation-selected accuracy (%) | Final accuracy (%) |" in md
    # sd is established better at the selected checkpoint and worse at the final one
    assert (
        "The ranking by test accuracy differs between the selected and final checkpoints: "
        "sd vs plain is better at the selected checkpoint and worse at the final one" in md
    )
    assert "- residual seed 102: diverged" in md
    assert "97.83 ± 0.31 % (n=3)" in md  # accuracy in percent, one conversion


def test_target_never_reached_is_null_not_zero():
    slow = [(0, 0.0, 0.0, 0.1), (5, 10.0, 15.0, 0.5)]
    recs = [_record("plain", s, 0.9, 0.9, curve=slow) for s in (1, 2)]
    s = summarise_study(recs, reference="plain", target_val_acc=0.97)
    ttt = s["recipes"]["plain"]["time_to_target"]
    assert ttt["reached"] == 0
    assert ttt["training_s"]["mean"] is None
    assert ttt["training_s"]["per_seed"] == {"1": None, "2": None}
    assert "—" in to_markdown(s)


def test_single_seed_gives_no_interval():
    recs = [_record("plain", 1, 0.98, 0.98), _record("sd", 1, 0.99, 0.99)]
    s = summarise_study(recs, reference="plain")
    c = s["comparisons"][0]
    assert c["diff"]["low"] is None and c["diff"]["n"] == 1
    assert c["verdict"] == "not established"
    assert s["recipes"]["plain"]["selected"]["test_acc"]["sd"] is None


def test_bad_records_are_refused():
    with pytest.raises(FathomError, match="no run records"):
        summarise_study([], reference="plain")
    with pytest.raises(FathomError, match=r"recipes present: \['plain', 'residual', 'sd'\]"):
        summarise_study(_study(), reference="dropout")
    mixed = [*_study(), _record("sd", 104, 0.99, 0.98, fingerprint={**FINGERPRINT, "batch": 128})]
    with pytest.raises(FathomError, match=r"field 'batch' is 64 .* but 128"):
        summarise_study(mixed, reference="plain")
    with pytest.raises(FathomError, match="two records for recipe 'sd' seed 101"):
        summarise_study([*_study(), _record("sd", 101, 0.9, 0.9)], reference="plain")
