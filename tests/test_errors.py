"""``fathom.errors``: "did you mean" for mistyped names and dotted config keys."""

from __future__ import annotations

import difflib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.errors import SUGGEST_CUTOFF, FathomError, did_you_mean, unknown_key

NAMES = st.lists(st.text("abcdefg-._", min_size=1, max_size=12), min_size=1, max_size=8)


def ratio(a: str, b: str) -> float:
    """The brute-force similarity: ``2 M / T`` of :class:`difflib.SequenceMatcher`."""
    return difflib.SequenceMatcher(None, a, b).ratio()


@settings(max_examples=300)
@given(word=st.text("abcdefg-._", max_size=12), known=NAMES)
@example(word="ciresan-fsat", known=["ciresan-fast", "ciresan-sd", "ciresan-fidelity"])
@example(word="zzzz", known=["train", "validate"])
def test_the_suggestion_is_a_closest_known_name_or_nothing(word: str, known: list[str]):
    """Offered iff some known name reaches the cutoff, and then one of the closest."""
    best = max(ratio(word, k) for k in known)
    hint = did_you_mean(word, known)
    if best < SUGGEST_CUTOFF:
        assert hint == ""
        return
    offered = hint.removeprefix("did you mean '").removesuffix("'?")
    assert offered in known and ratio(word, offered) == best, (hint, best)


PRESETS = ["ciresan-fast", "ciresan-fidelity", "staged-conv-lif-quick", "ciresan-sd"]
PRESETS += ["ciresan-sd-quick", "ciresan-seed-003", "ciresan-seed-003-quick", "quick"]


@settings(max_examples=200)
@given(name=st.sampled_from(PRESETS), at=st.integers(0, 30), edit=st.sampled_from("tds"))
def test_a_one_edit_typo_of_a_preset_is_answered(name: str, at: int, edit: str):
    """A transposition, deletion or substitution: a name at least as close as the one meant."""
    i = at % (len(name) - 1)
    typo = {
        "t": name[:i] + name[i + 1] + name[i] + name[i + 2 :],
        "d": name[:i] + name[i + 1 :],
        "s": name[:i] + ("x" if name[i] != "x" else "y") + name[i + 1 :],
    }[edit]
    hint = did_you_mean(typo, PRESETS)
    assert hint, typo
    offered = hint.removeprefix("did you mean '").removesuffix("'?")
    assert ratio(typo, offered) >= ratio(typo, name)


@pytest.mark.parametrize(
    ("word", "known", "want"),
    [
        ("ciresan-fsat", PRESETS, "ciresan-fast"),
        ("ciresan-sd-quik", PRESETS, "ciresan-sd-quick"),
        ("trian", ["train", "validate", "study", "runs"], "train"),
        ("stauts", ["run", "status"], "status"),
    ],
)
def test_the_issue_typos(word: str, known: list[str], want: str):
    assert did_you_mean(word, known) == f"did you mean {want!r}?"


TREE = {"name": "x", "optim": {"lr": 0.1, "epochs": 3, "schedule": {"kind": "constant"}}}


@pytest.mark.parametrize(
    ("key", "hint", "listed"),
    [
        ("optim.lrr", "optim.lr", "lr, epochs, schedule"),  # the section is right: its keys
        ("optim.schedule.knd", "optim.schedule.kind", "kind"),
        ("optm.lr", "optim.lr", None),  # a wrong section: the closest dotted key
        ("optim.lr.x", "optim.lr", None),  # a value is not a section
        ("optim.zzzzz", None, "lr, epochs, schedule"),
    ],
)
def test_unknown_keys_name_the_closest_key(key: str, hint: str | None, listed: str | None):
    err = unknown_key(key, TREE)
    assert isinstance(err, FathomError) and f"unknown config key {key!r}" in str(err)
    assert (f"(did you mean {hint!r}?)" in str(err)) if hint else "did you mean" not in str(err)
    assert (f"valid keys here: {listed}" in str(err)) if listed else "valid keys" not in str(err)


def test_a_mistyped_set_key_is_refused_and_changes_nothing():
    from fathom.config import RunConfig

    cfg = RunConfig()
    before = cfg.model_dump()
    with pytest.raises(FathomError, match=r"did you mean 'optim\.lr'\?"):
        cfg.with_updates({"optim.lrr": 0.1})
    assert cfg.model_dump() == before
