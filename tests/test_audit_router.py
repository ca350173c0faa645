"""Router against synthetic data: it must beat its shuffled control only when it can."""

from __future__ import annotations

import builtins

import numpy as np
import pytest
import torch

from fathom.audit import router as router_mod
from fathom.audit.router import (
    cheapest_correct,
    compare_with_control,
    fit_router,
    pooled_features,
    score_policy,
)
from fathom.errors import FathomError

pytestmark = pytest.mark.usefixtures("needs_sklearn")

COSTS = np.array([10.0, 20.0, 30.0, 40.0])  # mask 3 is the full network
FULL = 3


def nested_correct(need: np.ndarray) -> np.ndarray:
    """Mask m classifies example i correctly iff m >= need_i (cheaper masks fail)."""
    return np.arange(4)[:, None] >= need[None, :]


def test_pooled_features_are_7x7_block_means():
    x = torch.arange(28 * 28, dtype=torch.float32).reshape(1, 28, 28)
    f = pooled_features(x)
    assert f.shape == (1, 49)
    assert f[0, 0] == pytest.approx(x[0, :4, :4].mean().item())
    assert f[0, 48] == pytest.approx(x[0, 24:, 24:].mean().item())
    u8 = torch.full((2, 784), 255, dtype=torch.uint8)
    assert np.allclose(pooled_features(u8), 1.0)
    with pytest.raises(FathomError, match="square"):
        pooled_features(torch.zeros(2, 3, 10))


def test_cheapest_correct_target():
    correct = np.array([[0, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0]], dtype=bool)
    assert list(cheapest_correct(correct, COSTS, FULL)) == [1, 0, FULL]


def make_split(n: int, rng: np.random.Generator, informative: bool):
    need = rng.integers(0, 4, n)
    noise = rng.normal(size=(n, 5))
    # Informative: feature 0 is the answer itself.
    features = np.column_stack([need + 0.0, noise]) if informative else noise
    return features, nested_correct(need)


def test_informative_feature_beats_the_shuffled_control():
    rng = np.random.default_rng(0)
    f_val, c_val = make_split(800, rng, informative=True)
    f_test, c_test = make_split(800, rng, informative=True)
    router = fit_router(f_val, c_val, COSTS, FULL, tolerance=0.0, min_samples_leaf=10, seed=0)
    assign = router.assign(f_test)
    outcome = score_policy(c_test, assign, COSTS, FULL, tolerance=0.0)
    assert outcome.tolerance_held and outcome.error == 0.0
    assert outcome.cost_fraction == pytest.approx(
        (COSTS[cheapest_correct(c_test, COSTS, FULL)]).mean() / 40
    )
    cmp = compare_with_control(c_test, assign, n_permutations=200, seed=1)
    assert cmp.beats_control
    assert cmp.control_error_mean > 0.2
    assert cmp.p_value == pytest.approx(1 / 201)
    assert "below its matched-cost shuffled control" in cmp.verdict()


def test_uninformative_features_do_not_beat_the_control():
    beats = 0
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        f_val, c_val = make_split(600, rng, informative=False)
        f_test, c_test = make_split(600, rng, informative=False)
        router = fit_router(
            f_val, c_val, COSTS, FULL, tolerance=0.5, min_samples_leaf=30, seed=seed
        )
        assign = router.assign(f_test)
        cmp = compare_with_control(c_test, assign, n_permutations=200, seed=seed)
        beats += cmp.beats_control
    # Under the null a 5% test fires about once in 20; five or more would be p < 0.003.
    assert beats <= 4


def test_constant_assignment_has_no_advantage():
    rng = np.random.default_rng(5)
    _, c = make_split(100, rng, informative=False)
    cmp = compare_with_control(c, np.full(100, FULL), n_permutations=50)
    assert cmp.advantage == 0.0 and cmp.p_value == 1.0
    assert not cmp.beats_control
    assert cmp.verdict().startswith("no advantage")


def test_tolerance_can_fail_on_test():
    correct = np.ones((4, 10), dtype=bool)
    correct[0, :3] = False
    out = score_policy(correct, np.zeros(10, dtype=int), COSTS, FULL, tolerance=0.1)
    assert out.increase == pytest.approx(0.3)
    assert not out.tolerance_held
    assert out.cost_fraction == pytest.approx(0.25)


def test_missing_sklearn_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("sklearn"):
            raise ImportError("no sklearn")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(FathomError, match=r"pip install -e '\.\[audit\]'"):
        router_mod.require_sklearn()


def test_bad_router_inputs():
    rng = np.random.default_rng(0)
    f, c = make_split(50, rng, informative=True)
    with pytest.raises(FathomError, match="tolerance"):
        fit_router(f, c, COSTS, FULL, tolerance=-0.1)
    with pytest.raises(FathomError, match="feature rows"):
        fit_router(f[:10], c, COSTS, FULL, tolerance=0.0)
