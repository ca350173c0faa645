"""Branch interactions: the Möbius transform of each example's mask response.

For one example, ``f(S)`` is its centered logit vector under the mask keeping the branch
set ``S`` (logits minus their mean over classes, which removes the softmax-invariant
shift). On the subset lattice of the k branches::

    g(T) = Σ_{S ⊆ T} (-1)^{|T \\ S|} f(S)          (Möbius transform)
    f(S) = Σ_{T ⊆ S} g(T)                          (its inverse, the zeta transform)

``g(∅) = f(∅)`` is the constant term, ``g({l})`` the main effect of branch ``l`` and
``g(T)`` with ``|T| >= 2`` the interaction among the branches of ``T``. A response that is
additive over branches, ``f(S) = c + Σ_{l∈S} a_l``, has ``g(T) = 0`` for ``|T| >= 2``.

Interaction energy fraction of one example (undefined, ``None``/NaN, when the response is
constant)::

    ρ = Σ_{|T|>=2} ||g(T)||² / Σ_{|T|>=1} ||g(T)||²

This is the share of the *Möbius coefficients'* squared norm; the coefficients are not an
orthogonal basis, so ρ is a descriptive measure of how non-additively the branches combine,
not a variance decomposition.
"""

from __future__ import annotations

import numpy as np

from fathom.errors import FathomError


def _lattice_view(values: np.ndarray) -> tuple[np.ndarray, int]:
    m = values.shape[0]
    k = m.bit_length() - 1
    if m < 2 or (1 << k) != m:
        raise FathomError(
            f"the Möbius transform needs all 2^k masks in lattice order, got {m} rows; "
            "interactions are undefined for sampled masks"
        )
    # C order: axis j of the view is bit (k - 1 - j) of the mask index.
    return values.reshape((2,) * k + values.shape[1:]), k


def mobius(values: np.ndarray) -> np.ndarray:
    """``g = Möbius(f)`` along axis 0 (``[2^k, ...]``, rows in mask-index order)."""
    g = np.array(values, dtype=np.float64, copy=True)
    view, k = _lattice_view(g)
    for axis in range(k):
        hi = [slice(None)] * view.ndim
        lo = [slice(None)] * view.ndim
        hi[axis], lo[axis] = 1, 0
        view[tuple(hi)] -= view[tuple(lo)]
    return g


def subset_orders(k: int) -> np.ndarray:
    """``|T|`` for every mask index ``T = 0 .. 2^k - 1``."""
    idx = np.arange(1 << k)
    return np.array([bin(int(t)).count("1") for t in idx], dtype=np.int64)


def interaction_fraction(logits: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """Per-example ρ (module docstring) from logits ``[2^k, N, C]``; NaN where undefined.

    Logits are centered over classes, transformed in float64 in chunks of examples.
    """
    if logits.ndim != 3:
        raise FathomError(f"expected logits [masks, examples, classes], got shape {logits.shape}")
    k = logits.shape[0].bit_length() - 1
    order = subset_orders(k)
    out = np.empty(logits.shape[1], dtype=np.float64)
    for s in range(0, logits.shape[1], chunk):
        z = logits[:, s : s + chunk].astype(np.float64)
        z -= z.mean(axis=2, keepdims=True)
        energy = (mobius(z) ** 2).sum(axis=2)  # [2^k, n]: ||g(T)||² per example
        nonconstant = energy[order >= 1].sum(axis=0)
        higher = energy[order >= 2].sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[s : s + chunk] = np.where(nonconstant > 0, higher / nonconstant, np.nan)
    return out


def energy_by_order(logits: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """Total ``Σ_i Σ_{|T|=r} ||g_i(T)||²`` for each order ``r = 0 .. k`` (centered logits)."""
    k = logits.shape[0].bit_length() - 1
    order = subset_orders(k)
    totals = np.zeros(1 << k, dtype=np.float64)
    for s in range(0, logits.shape[1], chunk):
        z = logits[:, s : s + chunk].astype(np.float64)
        z -= z.mean(axis=2, keepdims=True)
        totals += (mobius(z) ** 2).sum(axis=(1, 2))
    return np.array([totals[order == r].sum() for r in range(k + 1)])
