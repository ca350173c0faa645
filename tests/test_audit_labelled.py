"""Per-mask results say which mask each number is (``fathom.audit.labelled.PerMask``), and
stay the arrays existing callers index, slice and compute with."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fathom.audit
from fathom.audit.labelled import PerMask
from fathom.depth import SkippableResidual
from fathom.errors import FathomError


@pytest.fixture(scope="module")
def scores():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 8),
        SkippableResidual(nn.Linear(8, 8)),
        SkippableResidual(nn.Linear(8, 8)),
        nn.Linear(8, 3),
    )
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    return fathom.audit.evaluate_masks(model, x, y), model, x, y


def _reference_accuracy(model, x, y, mask) -> float:
    """The fraction correct with the branches of ``mask`` kept, written out by hand (the
    model's float32 forward, the mean in float64)."""
    with torch.no_grad():
        h = model[0](x)
        for bit, block in zip(mask, (model[1], model[2]), strict=True):
            h = h + block.branch(h) if bit else h
        logits = model[3](h)
    return float((logits.argmax(1) == y).double().mean())


def test_each_number_is_labelled_by_its_mask_and_matches_a_reference(scores):
    s, model, x, y = scores
    acc = s.accuracy()
    assert isinstance(acc, PerMask) and isinstance(acc, np.ndarray) and acc.shape == (4,)
    assert acc.labels == ("00", "10", "01", "11") and acc.full == 3 and acc.unit == "fraction"
    for label in acc.labels:
        mask = tuple(int(b) for b in label)
        assert acc[label] == pytest.approx(_reference_accuracy(model, x, y, mask), abs=1e-12)
    assert acc.by_mask() == {label: float(v) for label, v in zip(acc.labels, np.asarray(acc))}
    assert s.mean_ce().unit == s.damage().unit == "nats" and s.damage()["11"] == 0.0


def test_the_printed_form_is_a_table_of_labels_and_display_units(scores):
    s = scores[0]
    acc, damage = s.accuracy(), s.damage()
    lines = str(acc).splitlines()
    assert lines[0] == "accuracy per mask (mask: branch 0 first, 1 kept, 0 removed)"
    assert [line.split()[0] for line in lines[1:]] == ["00", "10", "01", "11"]
    assert lines[-1].endswith("full network") and "full network" not in "".join(lines[1:-1])
    for line, v in zip(lines[1:], np.asarray(acc), strict=True):
        assert line.split()[1] == f"{100 * v:.2f}%"  # fathom.base.units: percent, 2 decimals
    assert repr(acc) == str(acc) and f"{acc}" == str(acc)
    assert str(damage).splitlines()[-1].split()[1:3] == ["+0.0000", "nats"]


def test_existing_callers_see_the_same_arrays(scores):
    s = scores[0]
    acc, ce = s.accuracy(), s.mean_ce()
    np.testing.assert_array_equal(acc, s.correct.mean(axis=1))
    np.testing.assert_array_equal(ce, s.ce.mean(axis=1))
    np.testing.assert_allclose(s.damage(), ce - ce[3])
    assert type(acc[3]) is np.float64 and acc[3] == acc["11"]
    assert float(acc.max()) == max(acc.tolist())
    for derived in (acc * 100, acc - acc[3], acc[::-1], acc[1:], acc == acc):
        assert type(derived) is np.ndarray, "a computed array no longer carries the labels"
    assert "%" not in repr(acc * 100)
    back = pickle.loads(pickle.dumps(acc))
    assert type(back) is np.ndarray and np.array_equal(back, acc)


def test_an_unknown_label_is_refused_naming_the_labels(scores):
    with pytest.raises(FathomError, match="no mask '111' among 00, 10, 01, 11"):
        scores[0].accuracy()["111"]


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(1, 4),
    data=st.data(),
    quantity=st.sampled_from(["accuracy", "mean CE", "CE damage"]),
)
def test_every_printed_row_is_its_mask_and_value(k, data, quantity):
    """Each printed row holds the mask's bits (branch 0 first) and the value in the display
    unit; reading by label gives the value of that row, whatever the masks and values."""
    from fathom.audit.masks import enumerate_masks

    masks = enumerate_masks(k)
    values = np.asarray(
        data.draw(
            st.lists(st.floats(0, 1, allow_nan=False), min_size=len(masks), max_size=len(masks))
        )
    )
    per = PerMask.of(values, masks, len(masks) - 1, quantity)
    lines = str(per).splitlines()[1:]
    assert len(lines) == len(masks)
    for m, (line, v) in enumerate(zip(lines, values, strict=True)):
        label = line.split()[0]
        assert label == "".join(str((m >> b) & 1) for b in range(k))  # the bits of m
        assert per[label] == v
        shown = line.split()[1]
        if quantity == "accuracy":
            assert shown == f"{100 * v:.2f}%"
        else:
            assert shown == (f"{v:+.4f}" if quantity == "CE damage" else f"{v:.4f}")
