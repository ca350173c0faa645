"""Checkpoint rankings from pairwise paired comparisons (``fathom.stats.ranking``): every
pair of recipes compared at both checkpoints in one Holm family per metric; "the ranking
differs" only when a pair is established in opposite directions at the two checkpoints."""

from __future__ import annotations

import itertools
import math
from typing import get_args

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fathom.errors import FathomError
from fathom.stats.claims import DECISION_RULES, check, decision_rule
from fathom.stats.results import Comparison, Decision, Results
from fathom.stats.summary import RunRecord, summarise_study
from fathom.stats.summary_md import to_markdown
from fathom.stats.verdicts import VERDICTS, ComparisonVerdict

SEEDS = (1, 2, 3)
NAMES = ("alpha", "beta", "gamma", "delta")


def _record(recipe, seed, sel_acc, fin_acc):
    return RunRecord(
        recipe=recipe,
        seed=seed,
        lr=0.01,
        status="complete",
        classes=10,
        selected={"test_acc": sel_acc, "test_ce": 1.0 - sel_acc, "val_ce": 0.1, "epoch": 2},
        final={"test_acc": fin_acc, "test_ce": 1.0 - fin_acc, "val_ce": 0.2, "epoch": 5},
        fit_acc_final=1.0,
        training_clock_s=1.0,
        elapsed_s=2.0,
        curve=[(1, 0.5, 1.0, 0.9)],
        fit_ce_final=0.01,
        n_test=10_000,
    )


def _summary(table, reference=None):
    """``table``: ``{recipe: {seed: (selected acc, final acc)}}``."""
    records = [_record(r, s, *v) for r, per in table.items() for s, v in per.items()]
    return summarise_study(records, reference=reference or next(iter(table)))


def _swap_table():
    """alpha is 3 pp ahead of beta at the selected checkpoint and 3 pp behind at the final
    one on every seed; gamma sits between them, 0.1 pp from beta at both."""
    noise = {1: 0.0, 2: 0.0004, 3: -0.0003}
    return {
        "alpha": {s: (0.95 + e, 0.92 + e) for s, e in noise.items()},
        "beta": {s: (0.92 + e / 2, 0.95 + e / 2) for s, e in noise.items()},
        "gamma": {s: (0.921 - e, 0.951 - e) for s, e in noise.items()},
    }


def test_an_established_opposite_pair_is_a_ranking_difference():
    s = _summary(_swap_table())
    claim = s["rankings"]["test_acc"]["claim"]
    assert claim["differs"] and claim["verdict"] == "differs"
    assert claim["swaps"] == [["alpha", "beta"], ["alpha", "gamma"]]
    # alpha is the reference: its two pairs are the summary's alpha comparisons (one verdict
    # per comparison on the page); the ranking's own family is beta vs gamma at 2 checkpoints
    assert claim["pairs"] == 3 and claim["family_size"] == 2
    assert claim["sentence"].startswith(
        "The ranking by test accuracy differs between the selected and final checkpoints: "
        "alpha vs beta is better at the selected checkpoint (difference +3.00 pp"
    )
    assert (
        "Holm over the 2 comparisons of this ranking, 1 pair(s) × 2 checkpoints; the 4 "
        "against the reference are the comparisons above, one verdict each" in claim["sentence"]
    )
    # the pairwise estimate is the mean per-seed difference (a − b) in pp, brute force
    pairs = {(p["a"], p["b"], p["checkpoint"]): p for p in s["rankings"]["test_acc"]["pairs"]}
    t = _swap_table()
    want = sum(100 * (t["alpha"][k][1] - t["beta"][k][1]) for k in SEEDS) / 3
    assert math.isclose(pairs[("alpha", "beta", "final")]["diff"]["estimate"], want)
    assert check(Results(**s["results"])) == []
    md = to_markdown(s)
    assert claim["sentence"] in md
    assert "| alpha | beta | final | -3.00 pp |" in md


def test_no_established_swap_says_how_many_pairs_are_established():
    t = _swap_table()
    # beta and gamma swap their means (0.1 pp apart), nothing else reorders
    t["gamma"] = {s: (0.9195, 0.9505) for s in SEEDS}
    t["alpha"] = {s: (0.95 + 0.0002 * s, 0.96 + 0.0002 * s) for s in SEEDS}
    s = _summary(t)
    claim = s["rankings"]["test_acc"]["claim"]
    assert not claim["differs"] and claim["swaps"] == []
    assert "is not established to differ" in claim["sentence"]
    assert "the recipe means reorder (1 pair(s) swap)" in claim["sentence"]
    assert "2 of 3 pair(s) at the selected checkpoint" in claim["sentence"]
    assert "alpha better than beta" in claim["sentence"]
    assert check(Results(**s["results"])) == []


def test_the_checker_catches_a_ranking_sentence_that_claims_too_much():
    t = _swap_table()
    t["gamma"] = {s: (0.9195, 0.9505) for s in SEEDS}
    t["alpha"] = {s: (0.95 + 0.0002 * s, 0.96 + 0.0002 * s) for s in SEEDS}
    res = Results(**_summary(t)["results"])
    d = res.decisions[0]
    forged = d.model_copy(update={"verdict": "differs"})
    bad = res.model_copy(update={"decisions": [forged, *res.decisions[1:]]})
    assert any("re-derived 'not established'" in p for p in check(bad))
    sentences = [
        x.model_copy(update={"text": x.text.replace("2 of 3 pair(s)", "3 of 3 pair(s)")})
        for x in res.sentences
    ]
    assert any(
        "does not print '2 of 3 pair(s)" in p
        for p in check(res.model_copy(update={"sentences": sentences}))
    )


LEVELS = (0.90, 0.93, 0.96)


@st.composite
def tables(draw):
    k = draw(st.integers(2, 4))
    table = {}
    for name in NAMES[:k]:
        sel, fin = draw(st.sampled_from(LEVELS)), draw(st.sampled_from(LEVELS))
        table[name] = {
            s: (
                sel + draw(st.integers(-3, 3)) * 1e-3 + 1e-5 * len(table),
                fin + draw(st.integers(-3, 3)) * 1e-3 + 1e-5 * len(table),
            )
            for s in SEEDS
        }
    return table


def _opposite(p, q):
    return {p["verdict"], q["verdict"]} == {"better", "worse"}


@settings(max_examples=25, deadline=None)
@given(tables())
@example(_swap_table())
def test_a_swap_is_never_stated_without_two_established_opposite_comparisons(table):
    s = _summary(table)
    assert check(Results(**s["results"])) == []
    for rk in s["rankings"].values():
        by = {(p["a"], p["b"], p["checkpoint"]): p for p in rk["pairs"]}
        k = len(rk["rows"])
        assert rk["claim"]["pairs"] == k * (k - 1) // 2 == len(by) // 2
        swaps = [
            [a, b]
            for (a, b, w) in by
            if w == "selected" and _opposite(by[(a, b, "selected")], by[(a, b, "final")])
        ]
        assert rk["claim"]["swaps"] == sorted(swaps)
        stated = "differs between the selected and final checkpoints" in rk["claim"]["sentence"]
        assert stated == bool(swaps) == rk["claim"]["differs"]
        if stated:  # an established swap is also a reordering of the means
            assert rk["disagree"]


@settings(max_examples=25, deadline=None)
@given(tables(), st.permutations(range(4)), st.randoms(use_true_random=False))
def test_permuting_recipes_permutes_the_ranking(table, perm, rnd):
    names = list(table)
    rename = {n: NAMES[perm[i]] for i, n in enumerate(names)}
    assume(len(set(rename.values())) == len(names))
    items = list(table.items())
    rnd.shuffle(items)
    renamed = {rename[n]: per for n, per in items}
    a = _summary(table, reference=names[0])
    b = _summary(renamed, reference=rename[names[0]])
    for key, rk in a["rankings"].items():
        other = b["rankings"][key]
        ca, cb = rk["claim"], other["claim"]
        assert ca["verdict"] == cb["verdict"] and ca["family_size"] == cb["family_size"]
        for w in ("selected", "final"):
            mapped = sorted([rename[x], rename[y], v] for x, y, v in ca["established"][w])
            assert mapped == sorted(cb["established"][w])
        assert sorted([rename[x], rename[y]] for x, y in ca["swaps"]) == sorted(cb["swaps"])
        assert [rename[n] for n in rk["selected_order"]] == other["selected_order"]


def test_pairs_cover_every_recipe_pair_once():
    s = _summary(_swap_table())
    rk = s["rankings"]["test_ce"]
    got = {frozenset((p["a"], p["b"])) for p in rk["pairs"]}
    assert got == {frozenset(p) for p in itertools.combinations(_swap_table(), 2)}


def test_one_comparison_never_gets_two_verdicts_on_one_page():
    """Each pair against the reference is the summary's own comparison (one verdict), and the
    claim checker refuses a page where one comparison is printed with two verdicts."""
    s = _summary(_swap_table())
    results = Results(**s["results"])
    main = {
        (c.a, c.b, c.quantity.name): c
        for c in results.comparisons
        if not c.id.startswith(("pair/", "ranking/"))
    }
    for c in results.comparisons:
        if c.id.startswith("pair/") and "alpha" in (c.a, c.b):
            twin = main.get((c.a, c.b, c.quantity.name)) or main[(c.b, c.a, c.quantity.name)]
            assert c.family == twin.family and c.low in (twin.low, -twin.high)
    assert check(results) == []
    pair = next(
        c for c in results.comparisons if c.id.startswith("pair/") and c.verdict != "better"
    )
    other = pair.model_copy(update={"id": "again", "family": "another family", "verdict": "better"})
    problems = check(results.model_copy(update={"comparisons": [*results.comparisons, other]}))
    assert any("one comparison gets one verdict per page" in p for p in problems)


def test_a_decision_of_an_unknown_rule_is_refused_not_skipped():
    """Every decision is re-derived by its rule's row in DECISION_RULES: a rule with no row
    (a typo, a rule added without its re-derivation) raises naming the known rules, and is
    never misrouted to another rule's checker nor passed over."""
    res = Results(**_summary(_swap_table())["results"])
    assert res.decisions and check(res) == []
    assert {d.rule for d in res.decisions} <= set(DECISION_RULES)
    typo = res.decisions[0].model_copy(update={"rule": "checkpoint rankings"})
    bad = res.model_copy(update={"decisions": [typo, *res.decisions[1:]]})
    with pytest.raises(FathomError, match="'checkpoint rankings' has no re-derivation.*known"):
        check(bad)
    with pytest.raises(FathomError, match="depth scaling level"):
        decision_rule("depth scaling levels")


def test_verdicts_are_a_closed_vocabulary():
    """A comparison's or a decision's verdict outside its Literal is refused on validation
    (a results file with a free-string verdict does not load)."""
    res = Results(**_summary(_swap_table())["results"])
    c, d = res.comparisons[0], res.decisions[0]
    assert set(get_args(ComparisonVerdict)) == set(VERDICTS)
    with pytest.raises(ValidationError, match="verdict"):
        Comparison.model_validate({**c.model_dump(), "verdict": "somewhat better"})
    with pytest.raises(ValidationError, match="verdict"):
        Decision.model_validate({**d.model_dump(), "verdict": "differ"})
    assert Decision.model_validate(d.model_dump()) == d
