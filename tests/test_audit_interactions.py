"""Möbius transform on the subset lattice: brute-force reference, round trip, additivity."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fathom.audit.interactions import (
    energy_by_order,
    interaction_fraction,
    mobius,
    subset_orders,
)
from fathom.errors import FathomError


def brute_mobius(f: np.ndarray) -> np.ndarray:
    """``g(T) = Σ_{S ⊆ T} (-1)^{|T \\ S|} f(S)`` by explicit subset loops (float64)."""
    m = f.shape[0]
    g = np.zeros_like(f, dtype=np.float64)
    for t in range(m):
        for s in range(m):
            if s & t == s:
                g[t] += (-1) ** bin(t & ~s).count("1") * f[s]
    return g


def brute_zeta(g: np.ndarray) -> np.ndarray:
    """``f(S) = Σ_{T ⊆ S} g(T)``, the inverse of the Möbius transform, by explicit subset
    loops (float64); rows in mask-index order."""
    m = g.shape[0]
    f = np.zeros_like(g, dtype=np.float64)
    for s in range(m):
        for t in range(m):
            if s & t == t:
                f[s] += g[t]
    return f


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_mobius_matches_brute_force_and_inverts(k):
    rng = np.random.default_rng(k)
    f = rng.normal(size=(1 << k, 6, 3))
    g = mobius(f)
    np.testing.assert_allclose(g, brute_mobius(f), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(brute_zeta(g), f, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mobius(brute_zeta(f)), f, rtol=1e-12, atol=1e-12)


def test_integer_round_trip_is_exact():
    f = np.random.default_rng(0).integers(-1000, 1000, size=(16, 7)).astype(np.float64)
    assert np.array_equal(brute_zeta(mobius(f)), f)


def additive_logits(k: int, n: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    const = rng.normal(size=(n, c))
    effects = rng.normal(size=(k, n, c))
    logits = np.empty((1 << k, n, c))
    for m in range(1 << k):
        logits[m] = const + sum(effects[b] for b in range(k) if (m >> b) & 1)
    return logits, effects


def test_additive_model_has_zero_interaction_energy():
    logits, effects = additive_logits(4, 30, 10, seed=1)
    rho = interaction_fraction(logits.astype(np.float32))
    assert np.all(rho < 1e-10)
    energy = energy_by_order(logits)
    centered = effects - effects.mean(axis=2, keepdims=True)
    np.testing.assert_allclose(energy[1], (centered**2).sum(), rtol=1e-10)
    assert np.all(energy[2:] < 1e-10 * energy[1])


def test_pure_pairwise_interaction_has_fraction_one():
    n, c = 5, 4
    rng = np.random.default_rng(2)
    pair = rng.normal(size=(n, c))
    logits = np.zeros((4, n, c))
    logits[3] = pair  # f(S) = pair only when both branches are kept
    rho = interaction_fraction(logits)
    np.testing.assert_allclose(rho, 1.0)


def test_interaction_fraction_brute_force_reference():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(8, 12, 5))
    rho = interaction_fraction(logits, chunk=5)
    order = subset_orders(3)
    for i in range(12):
        z = logits[:, i] - logits[:, i].mean(axis=1, keepdims=True)
        g = brute_mobius(z)
        e = (g**2).sum(axis=1)
        assert rho[i] == pytest.approx(e[order >= 2].sum() / e[order >= 1].sum(), rel=1e-12)


def test_constant_response_is_undefined_not_zero():
    logits = np.tile(np.arange(5.0), (4, 3, 1))
    assert np.all(np.isnan(interaction_fraction(logits)))


def test_subset_orders():
    assert list(subset_orders(3)) == [0, 1, 1, 2, 1, 2, 2, 3]
    assert all(
        sum(subset_orders(4) == r) == len(list(itertools.combinations(range(4), r)))
        for r in range(5)
    )


def test_sampled_masks_are_rejected():
    with pytest.raises(FathomError, match="all 2\\^k masks"):
        mobius(np.zeros((6, 2)))
