"""Branch masks: which of the k skippable branches a reduced network keeps.

A mask is a tuple of k bits, ``mask[l] = 1`` keeps branch ``l`` (gain one, the deployment
convention) and ``0`` deletes it (the branch is not computed). Mask number ``m`` of the
full enumeration is the subset whose bits are those of ``m``::

    mask_m[l] = (m >> l) & 1          m = 0 .. 2^k - 1

so index 0 is the empty mask (every branch removed) and ``2^k - 1`` is the full network.
That order is the subset lattice the Möbius transform in :mod:`fathom.audit.interactions`
works on.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from fathom.errors import FathomError

MAX_ENUMERATED_MASKS = 4096
"""All masks are evaluated while ``2^k <= 4096`` (k <= 12); beyond that, sample masks."""


def removable_branch_count(model: nn.Module) -> int:
    """Number k of :class:`fathom.depth.SkippableResidual` branches; FathomError when none."""
    from fathom.depth import find_branches

    count = len(find_branches(model))
    if count == 0:
        raise FathomError(
            f"{type(model).__name__} has no removable branches (no fathom.depth."
            "SkippableResidual module, e.g. the Ciresan recipe 'plain' or a conv net without "
            "residual blocks), so there is nothing to delete; wrap each residual branch in "
            "SkippableResidual(branch, bypass), or audit a residual recipe"
        )
    return count


def enumerate_masks(k: int, max_masks: int = MAX_ENUMERATED_MASKS) -> np.ndarray:
    """All ``2^k`` masks as a ``uint8`` array ``[2^k, k]``, row ``m`` holding the bits of ``m``."""
    if k < 1:
        raise FathomError(f"k={k}: a mask needs at least one removable branch")
    total = 1 << k
    if total > max_masks:
        raise FathomError(
            f"{k} removable branches give 2^{k} = {total} masks, more than the enumeration "
            f"limit of {max_masks}; evaluate sampled masks instead (fathom audit --sample-masks N, "
            "or sample_masks(k, n, seed)), or raise the limit with --max-masks"
        )
    m = np.arange(total)[:, None]
    return ((m >> np.arange(k)[None, :]) & 1).astype(np.uint8)


def sample_masks(k: int, n: int, seed: int) -> np.ndarray:
    """``n`` distinct masks for a model too deep to enumerate, as ``uint8 [n, k]``.

    Always contains the full network, every single deletion and the empty mask (k + 2
    masks); the rest are drawn uniformly without replacement from the remaining subsets
    with a ``numpy`` generator seeded by ``seed``. Rows are sorted by mask size, full last.
    """
    if k < 1:
        raise FathomError(f"k={k}: a mask needs at least one removable branch")
    required = min(k + 2, 1 << k)
    if n < required:
        raise FathomError(
            f"{n} sampled masks cannot hold the full network, the {k} single deletions and the "
            f"empty mask; ask for at least {required}"
        )
    total = 1 << k if k < 63 else None
    if total is not None and n > total:
        raise FathomError(f"asked for {n} masks but {k} branches have only {total}; use all masks")
    chosen: set[tuple[int, ...]] = {tuple([1] * k), tuple([0] * k)}
    for removed in range(k):
        chosen.add(tuple(0 if j == removed else 1 for j in range(k)))
    rng = np.random.default_rng(seed)
    while len(chosen) < n:
        chosen.add(tuple(int(b) for b in rng.integers(0, 2, size=k)))
    rows = sorted(chosen, key=lambda mk: (sum(mk), mk))
    return np.asarray(rows, dtype=np.uint8)


def full_mask_index(masks: np.ndarray) -> int:
    """Row of ``masks`` that keeps every branch; FathomError when absent."""
    rows = np.flatnonzero(masks.all(axis=1))
    if rows.size != 1:
        raise FathomError("the mask set must contain the full network (all branches kept) once")
    return int(rows[0])


def is_full_lattice(masks: np.ndarray) -> bool:
    """True when ``masks`` is exactly :func:`enumerate_masks` order (needed by Möbius)."""
    k = masks.shape[1]
    return masks.shape[0] == (1 << k) and np.array_equal(
        masks, enumerate_masks(k, max_masks=masks.shape[0])
    )


def mask_label(mask: np.ndarray | tuple[int, ...]) -> str:
    """``"1011"``: branch 0 first, ``1`` kept, ``0`` removed."""
    return "".join(str(int(b)) for b in mask)
