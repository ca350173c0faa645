"""One "due" predicate (:func:`fathom.config_models.schedule_due`) for every epoch-boundary
schedule of a run: telemetry, evaluation, the health instrument and the resume state.

Each schedule is checked against its own brute-force reference, written here from the
config documentation's sentence (the formulas the trainer used before they shared one
definition), on every epoch of generated runs, and beyond them.
"""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.config_models import schedule_due
from fathom.train.observe import eval_due, health_due

LAST = st.integers(min_value=0, max_value=40)
EVERY = st.integers(min_value=1, max_value=12)
FIRST = st.lists(st.integers(min_value=0, max_value=40), max_size=4).map(tuple)


def _cfg(last: int, every: int, first: tuple[int, ...], target=None, enabled=True):
    """The four config fields the predicates read (a full RunConfig is not needed)."""
    return SimpleNamespace(
        optim=SimpleNamespace(epochs=last),
        eval=SimpleNamespace(every=every, first=first),
        stop=SimpleNamespace(target_test_acc=target),
        health=SimpleNamespace(enabled=enabled, every=every),
    )


@settings(max_examples=200)
@given(last=LAST, every=EVERY, first=FIRST)
@example(last=0, every=5, first=())  # a run of no epochs: only epoch 0, the last
@example(last=25, every=10, first=(0, 1))  # the telemetry default shape
def test_schedule_due_matches_its_definition(last, every, first):
    for epoch in range(-2, last + every + 3):
        inside = 0 <= epoch <= last
        expected = inside and (
            epoch in first or (epoch > 0 and epoch % every == 0) or epoch == last
        )
        assert schedule_due(epoch, first, every, last) == expected, epoch


@settings(max_examples=200)
@given(last=LAST, every=EVERY, first=FIRST, target=st.sampled_from([None, 0.9]))
def test_eval_due_is_the_old_rule_on_every_epoch_of_training(last, every, first, target):
    first = tuple(e for e in first if e <= last)  # config validation keeps eval.first in range
    cfg = _cfg(last, every, first, target)
    for epoch in range(last + 1):
        old = (
            target is not None
            or epoch == 0
            or epoch in first
            or epoch % every == 0
            or epoch == last
        )
        assert eval_due(cfg, epoch) == old, epoch


@settings(max_examples=200)
@given(last=LAST, every=EVERY, enabled=st.booleans())
def test_health_due_is_the_old_rule_on_every_epoch_of_training(last, every, enabled):
    cfg = _cfg(last, every, (), enabled=enabled)
    for epoch in range(last + 1):
        old = enabled and (epoch % every == 0 or epoch == last)
        assert health_due(cfg, epoch) == old, epoch


@settings(max_examples=200)
@given(last=st.integers(min_value=1, max_value=40), every=EVERY)
def test_resume_state_schedule_is_the_old_rule(last, every):
    """The trainer writes the resume state at epochs 1 .. last when this holds (or a stop)."""
    for epoch in range(1, last + 1):
        assert schedule_due(epoch, (), every, last) == (epoch % every == 0 or epoch == last)


def test_schedule_due_never_beyond_training():
    assert [e for e in range(0, 31) if schedule_due(e, (0, 1), 10, 25)] == [0, 1, 10, 20, 25]
    assert not schedule_due(30, (30,), 10, 25)  # listed, but after the last epoch
    assert not schedule_due(-1, (-1,), 1, 25)
