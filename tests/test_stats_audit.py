"""The audit's paired-damage verdicts come from the engine: one Holm family per checkpoint,
every sentence passing the claim checker, bad input as "no comparison"."""

from __future__ import annotations

from fathom.audit.aggregate import paired_damage
from fathom.stats import Comparison, Results, check
from fathom.stats.audit_sentences import damage_sentences
from fathom.stats.results import Claim, Sentence


def _arm(damage_by_seed: dict[int, dict[str, float]], flags=()):
    return {
        s: {
            "k": 4,
            "flags": {"final": list(flags)},
            "by_size": {
                "4": {"test": {"damage": 0.0}},
                **{k: {"test": {"damage": v}} for k, v in d.items()},
            },
        }
        for s, d in damage_by_seed.items()
    }


def test_paired_damage_is_one_checked_family():
    arms = {
        "residual": _arm(
            {1: {"2": 0.50, "3": 0.20}, 2: {"2": 0.52, "3": 0.21}, 3: {"2": 0.49, "3": 0.22}}
        ),
        "sd": _arm(
            {1: {"2": 0.10, "3": 0.05}, 2: {"2": 0.11, "3": 0.04}, 3: {"2": 0.12, "3": 0.05}}
        ),
    }
    rows = paired_damage(arms, "final")
    comps = [Comparison.model_validate(r["verdict"]["comparison"]) for r in rows]
    assert {c.family_size for c in comps} == {2}
    assert all(c.verdict == "better" for c in comps)  # less damage is better
    sentences = [
        Sentence(
            text=r["sentence"],
            claims=[Claim(comparison=c.id, verdict=c.verdict, fragile=c.fragile)],
        )
        for r, c in zip(rows, comps)
    ]
    assert check(Results(comparisons=comps, sentences=sentences)) == []
    (digest,) = damage_sentences({"final": {"paired_damage": rows, "arms": {"sd": {"k": 4}}}})
    assert digest.startswith(
        "sd vs residual, final checkpoint, test damage ΔCE: 2 of 4 kept better ("
    )


def test_unequal_seeds_and_excluded_arms_are_no_comparison():
    arms = {
        "residual": _arm({1: {"2": 0.5}, 2: {"2": 0.5}}),
        "sd": _arm({1: {"2": 0.1}}),
    }
    (row,) = paired_damage(arms, "final")
    assert row["verdict"]["verdict"] == "no comparison" and "unequal seeds" in row["sentence"]
    arms["sd"] = _arm({1: {"2": 0.1}, 2: {"2": 0.1}}, flags=["at_chance"])
    (row,) = paired_damage(arms, "final")
    assert "sd excluded (at_chance)" in row["sentence"]
