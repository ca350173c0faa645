"""Study summary on small hand-made run records."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fathom.errors import FathomError
from fathom.stats.summary import RunRecord, summarise_study
from fathom.stats.summary_md import to_markdown

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
        n_test=kw.pop("n_test", 10_000),
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
    # accuracy differences in percentage points, against a brute-force interval at the
    # comparison's Holm level: mean ± max(t·sd/√n, z·floor), floor from the binomial bound
    d = np.array([99.0, 98.9, 99.1]) - np.array([98.1, 97.5, 97.9])
    q = (1 + sel["diff"]["level"]) / 2
    floor = math.sqrt(3 * 2 * 1e4 * 0.25 / 10_000) / 3
    half = max(stats.t.ppf(q, 2) * d.std(ddof=1) / math.sqrt(3), stats.norm.ppf(q) * floor)
    assert sel["unit"] == "percentage points"
    assert sel["diff"]["low"] == pytest.approx(d.mean() - half)
    assert sel["diff"]["high"] == pytest.approx(d.mean() + half)
    # 4 comparisons with intervals (residual's are blocked): Holm levels 1 − 0.05/(4 − k + 1)
    levels = sorted(
        c["diff"]["level"] for c in s["comparisons"] if c["diff"] and c["diff"]["low"] is not None
    )
    assert len(levels) == 4 and levels[-1] == pytest.approx(1 - 0.05 / 4)
    assert "test accuracy (selected checkpoint)" in sel["sentence"]
    assert sel["verdict"] in ("better", "not established")
    for c in s["comparisons"]:
        assert c["sentence"].startswith(f"{c['recipe']} vs plain on ")
    assert any("Holm-corrected over the 4 comparisons" in n for n in s["notes"])

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
    assert "| Method | LR | n | Selected test accuracy (%) | Final test accuracy (%) |" in md
    # sd and plain swap, but after Holm and the resolution floor neither checkpoint's paired
    # difference is established (residual's are no comparison): no ranking claim
    assert (
        "The ranking by test accuracy is not established to differ between the selected and "
        "final checkpoints" in md
    )
    # the ranking's one pair, sd vs plain, is the summary's own sd-vs-reference comparison:
    # printed with that one verdict (Holm over the 4 of its family), never judged again in a
    # second family where it could read otherwise
    assert "0 of 1 pair(s) at the selected checkpoint" in md
    assert "the 2 against the reference are the comparisons above" in md
    assert "(Holm over their family of 4)" in md
    assert "- residual seed 102: diverged" in md
    assert "| 3 | 97.83 ± 0.31% |" in md  # accuracy in percent, one conversion; n in its column


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
    assert "no interval" in c["sentence"]
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


@pytest.mark.parametrize(
    ("scale", "shift", "match"),
    [(100.0, 0.0, "look like percent.*divide by 100"), (1.0, -1.0, r"outside \[0, 1\]")],
    ids=["percent", "negative"],
)
def test_accuracies_that_are_not_fractions_are_refused(scale, shift, match):
    """A study given in percent was judged as fractions ("better (+8910.67 pp)")."""
    recs = [
        _record(r.recipe, r.seed, r.selected["test_acc"] * scale + shift,
                r.final["test_acc"] * scale + shift, fit_acc=scale)
        for r in _study() if r.recipe != "residual"
    ]  # fmt: skip
    with pytest.raises(FathomError, match=match):
        summarise_study(recs, reference="plain")


def test_every_summary_sentence_passes_the_claim_checker():
    from fathom.stats.claims import check
    from fathom.stats.results import Results

    for recs in (_study(), [r for r in _study() if r.recipe != "residual"]):
        s = summarise_study(recs, reference="plain", target_val_acc=0.97)
        results = Results.model_validate(s["results"])
        assert check(results) == []
        texts = [x.text for x in results.sentences]
        main = len(s["comparisons"])
        assert texts[:main] == [c["sentence"] for c in s["comparisons"]]
        # then, per ranking, its pairwise comparisons' sentences and its statement
        claims = [rk["claim"]["sentence"] for rk in s["rankings"].values()]
        assert [t for t in texts[main:] if t.startswith("The ranking by ")] == claims


def test_the_claim_checker_catches_a_false_sentence():
    from fathom.stats.claims import check
    from fathom.stats.results import Claim, Results, Sentence

    s = summarise_study(_study(), reference="plain")
    results = Results.model_validate(s["results"])
    c = results.comparisons[0]
    wrong = "better" if c.verdict != "better" else "worse"
    lie = Sentence(text=c.a + " is " + wrong, claims=[Claim(comparison=c.id, verdict=wrong)])
    problems = check(results.model_copy(update={"sentences": [lie]}))
    assert any("claim on" in p for p in problems)
    tampered = c.model_copy(update={"verdict": wrong})
    problems = check(
        results.model_copy(update={"comparisons": [tampered, *results.comparisons[1:]]})
    )
    assert any("re-derived" in p for p in problems)


def test_every_output_renders_the_one_results_model():
    """summary.md, the report's verdict list and summary.json print the model's sentences."""
    from fathom.report.sections import split_sentences
    from fathom.stats.results import Results

    s = summarise_study(_study(), reference="plain", target_val_acc=0.97)
    results = Results.model_validate(json.loads(json.dumps(s))["results"])
    md = to_markdown(s)
    texts = [x.text for x in results.sentences]
    main = len(s["comparisons"])
    assert all(f"- {t}" in md for t in texts[:main])
    # a ranking's statement is printed whole; its pairwise comparisons as table rows
    assert all(f"\n{t}\n" in md for t in texts[main:] if t.startswith("The ranking by "))
    for c in results.comparisons[main:]:
        assert f"| {c.a} | {c.b} | {c.context['checkpoint']} |" in md
    decided, undecided = split_sentences(s)  # the report's verdict lists, each text once
    assert set(decided + undecided) == set(texts)
    for c, row in zip(results.comparisons, s["comparisons"]):
        assert (row["verdict"], row["fragile"]) == (c.verdict, c.fragile)
        assert row["diff"] is None or row["diff"]["low"] == c.low
        assert f"| {c.verdict} |" in md or f"| {c.verdict}, fragile |" in md


@settings(max_examples=12)
@given(
    st.integers(2, 4),
    st.lists(st.lists(st.floats(0.05, 1.0), min_size=8, max_size=8), min_size=3, max_size=3),
)
def test_generated_summaries_pass_the_claim_checker(n_seeds, accs):
    from fathom.stats.claims import check
    from fathom.stats.results import Results

    recs = [
        _record(name, seed, accs[i][j], accs[i][j + 4])
        for i, name in enumerate(("plain", "sd", "res"))
        for j, seed in enumerate(range(1, n_seeds + 1))
    ]
    s = summarise_study(recs, reference="plain")
    assert check(Results.model_validate(s["results"])) == []
    # an excluded recipe (at or near chance) is never ranked by a verdict
    for c in s["comparisons"]:
        if s["recipes"][c["recipe"]]["excluded"]:
            assert c["verdict"] == "no comparison"


def test_not_fitting_is_a_caveat_in_the_sentence_not_an_exclusion():
    recs = [*_study()[:6]]
    recs[3] = _record("sd", 101, 0.990, 0.980, train_s=70.0, fit_acc=0.3)
    s = summarise_study(recs, reference="plain")
    c = next(c for c in s["comparisons"] if c["recipe"] == "sd")
    assert c["verdict"] != "no comparison"
    assert "caveat: sd not fitting" in c["sentence"]
