"""'What was scaled down' is computed from the config, not repeated from the user's notes."""

from fathom.study.config import load_study, validate_study_config
from fathom.study.scaledown import FULL_PROTOCOL, scale_down_sentence, scaled_down


def _variant(**edits):
    """The full protocol with dotted-key edits (e.g. ``base__optim__epochs=2``)."""
    data = load_study(FULL_PROTOCOL)[0].to_data()
    for key, value in edits.items():
        *parents, last = key.split("__")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return validate_study_config(data)


def test_full_protocol_is_not_scaled_down():
    full = load_study(FULL_PROTOCOL)[0]
    assert scaled_down(full) == []
    assert scale_down_sentence([]) == "Not scaled down: the full protocol (preset ciresan-sd)."


def test_issue_study_without_notes_is_reported_scaled_down():
    # width 0.05 over 1,000 examples for 2 epochs, with an empty scale_down list
    study = _variant(
        base__model__width_mult=0.05,
        base__data__fit_subset=1000,
        base__optim__epochs=2,
        study__scale_down=[],
    )
    items = scaled_down(study)
    assert [d.key for d in items] == [
        "base.model.width_mult",
        "base.data.fit_subset",
        "base.optim.epochs",
    ]
    assert all(d.kind == "reduced" for d in items)
    assert items[0].text == (
        "widths x 0.05: 784-125-100-75-50-25-10 instead of 784-2500-2000-1500-1000-500-10"
    )
    assert items[1].text == "fitting set: the first 1,000 of the 50,000 fitting examples"
    assert items[2].text == "2 epochs instead of 100"
    text = scale_down_sentence(items)
    assert text.startswith("Scaled down from the full protocol (preset ciresan-sd): widths x 0.05")
    assert "Not scaled down" not in text
    assert (items[2].study, items[2].full) == (2, 100)


def test_changes_that_are_not_reductions_are_listed_separately():
    study = _variant(
        base__optim__batch_size=128,
        base__eval__every=1,
        study__seeds=[101, 102],
        tuning__enabled=False,
        study__lr=0.03,
        base__optim__weight_decay=0.0005,
        base__telemetry__enabled=False,  # read-only instruments: not a protocol change
        study__threads_per_run=1,
    )
    items = {d.key: d for d in scaled_down(study)}
    assert set(items) == {
        "base.optim.batch_size",
        "base.eval.every",
        "study.seeds",
        "tuning.enabled",
        "base.optim.weight_decay",
    }
    assert items["study.seeds"].kind == "reduced"
    assert items["study.seeds"].text == "2 seed(s) (101, 102) instead of 3 (101, 102, 103)"
    assert items["tuning.enabled"].kind == "reduced"
    assert items["tuning.enabled"].text.startswith("no tuning phase (fixed LR 0.03) instead of")
    assert items["base.optim.batch_size"].kind == "changed"
    assert items["base.eval.every"].text == (
        "evaluation at epoch(s) 1 and every 1 instead of epoch(s) 1 and every 5"
    )
    assert items["base.optim.weight_decay"].text == "optim.weight_decay 0.0005 instead of 0"
    text = scale_down_sentence(list(items.values()))
    assert "Also differs: " in text and "batch size 128 instead of 64" in text


def test_recipe_subset_and_quick_preset():
    study = _variant(study__recipes=["plain", "residual"])
    (item,) = scaled_down(study)
    assert (
        item.text
        == "recipes plain, residual (without residual_dropout, sd_constant, sd_decreasing)"
    )
    assert item.kind == "reduced"
    quick = {d.key for d in scaled_down(load_study("ciresan-sd-quick")[0])}
    assert {
        "base.model.width_mult",
        "base.data.fit_subset",
        "base.data.eval_subset",
        "base.optim.epochs",
        "base.eval.every",
    } <= quick


def test_a_custom_study_gets_no_statement_against_a_protocol_it_never_named():
    """A user's own study (fashion-mnist, its own widths, no ``study.protocol``) is compared
    with nothing: no invented "scaled down from ciresan-sd" sentence, and the line says why."""
    from fathom.study.scaledown import NO_PROTOCOL

    study = validate_study_config(
        {
            "study": {"name": "mine", "reference": "plain", "recipes": ["plain"], "lr": 0.1},
            "base": {"data": {"dataset": "fashion-mnist"}, "model": {"widths": [64, 32]}},
        }
    )
    assert study.study.protocol is None and scaled_down(study) == []
    text = scale_down_sentence(scaled_down(study), study.study.protocol)
    assert text == NO_PROTOCOL and 'ciresan-sd",' in text and "Scaled down" not in text
    named = validate_study_config(
        {**study.to_data(), "study": {**study.to_data()["study"], "protocol": "ciresan-sd"}}
    )
    assert {d.key for d in scaled_down(named)} >= {"base.data.dataset", "base.model.widths"}


def test_a_protocol_that_is_no_preset_is_refused():
    import pytest

    from fathom.errors import FathomError

    data = load_study(FULL_PROTOCOL)[0].to_data()
    data["study"]["protocol"] = "ciresan-xx"
    with pytest.raises(FathomError, match="protocol 'ciresan-xx' is not a study preset"):
        validate_study_config(data)
