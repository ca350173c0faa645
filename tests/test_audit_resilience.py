"""Per-class resilience and margin standardization on synthetic cases with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from fathom.audit.masks import enumerate_masks
from fathom.audit.resilience import (
    class_resilience,
    contrast_population,
    fit_margin_bins,
    resilience_per_example,
)
from fathom.errors import FathomError


def test_resilience_counts_two_branch_masks_among_full_correct():
    masks = enumerate_masks(4)
    correct = np.ones((16, 3), dtype=bool)
    two = np.flatnonzero(masks.sum(axis=1) == 2)
    correct[two[:2], 0] = False  # example 0 fails 2 of the 6 two-branch masks
    correct[15, 2] = False  # example 2 is wrong under the full model
    r = resilience_per_example(correct, masks, full_index=15, keep=2)
    assert r[0] == pytest.approx(4 / 6)
    assert r[1] == 1.0
    assert np.isnan(r[2])
    with pytest.raises(FathomError, match="keeps exactly 5"):
        resilience_per_example(correct, masks, 15, keep=5)


def synthetic(n_per: dict[int, tuple[int, int]], seed: int):
    """Examples of classes with (low-margin count, high-margin count); r = 0.5 low, 1.0 high."""
    rng = np.random.default_rng(seed)
    labels, margin, r = [], [], []
    for c, (low, high) in n_per.items():
        labels += [c] * (low + high)
        margin += list(rng.uniform(0.1, 0.9, low)) + list(rng.uniform(5.0, 9.0, high))
        r += [0.5] * low + [1.0] * high
    return np.array(labels), np.array(margin), np.array(r)


def test_standardization_removes_a_pure_margin_effect():
    # Resilience depends only on the margin (0.5 low, 1.0 high). Class 1 is mostly confident
    # (raw mean (10·0.5 + 90)/100 = 0.95); classes 4 and 9 mostly not ((70·0.5 + 30)/100 =
    # 0.65). Pooled there are 150 low and 150 high margins, so the validation median splits
    # them exactly and the standardized contrast is exactly zero.
    labels, margin, r = synthetic({1: (10, 90), 4: (70, 30), 9: (70, 30)}, seed=0)
    pop = contrast_population(r, labels, 1, (4, 9))
    bins = fit_margin_bins(margin[pop], n_bins=2)
    assert bins.weights == pytest.approx([0.5, 0.5])
    res = class_resilience(r, margin, labels, 10, 1, (4, 9), bins)
    assert res.contrast_raw == pytest.approx(0.95 - 0.65)
    assert res.contrast_standardized == pytest.approx(0.0, abs=1e-12)
    assert res.class_means[1] == pytest.approx(0.95)
    assert res.class_counts[1] == 100 and res.class_counts[0] == 0
    assert res.class_means[0] is None


def test_standardized_contrast_known_answer_with_fixed_bins():
    # Two bins split at margin 2; shared weights (0.3, 0.7) fixed elsewhere (validation).
    # Within bins class 1 is better by 0.1 (low) and 0.2 (high): Δ_std = 0.3·0.1 + 0.7·0.2.
    from fathom.audit.resilience import MarginBins

    bins = MarginBins(edges=np.array([2.0]), weights=np.array([0.3, 0.7]))
    labels = np.array([1] * 4 + [4] * 4 + [9] * 4)
    margin = np.array([1, 1, 1, 5] * 3, dtype=float)  # 3 low, 1 high per class
    r = np.array([0.6] * 3 + [1.0] + [0.5] * 3 + [0.8] + [0.5] * 3 + [0.8])
    res = class_resilience(r, margin, labels, 10, 1, (4, 9), bins)
    assert res.contrast_raw == pytest.approx((0.6 * 0.75 + 0.25 * 1.0) - (0.5 * 0.75 + 0.25 * 0.8))
    assert res.contrast_standardized == pytest.approx(0.3 * 0.1 + 0.7 * 0.2)
    assert res.standardized_means[1] == pytest.approx(0.3 * 0.6 + 0.7 * 1.0)


def test_bins_fixed_on_validation_apply_to_test():
    _, margin_v, _ = synthetic({1: (50, 50), 4: (50, 50), 9: (50, 50)}, seed=1)
    bins = fit_margin_bins(margin_v, n_bins=2)
    assert bins.weights == pytest.approx([0.5, 0.5])
    assert 0.9 <= bins.edges[0] <= 5.0
    # Test split with a different margin mix: class 1 confident, 4/9 not. Bins from
    # validation still split low/high, so standardization recovers a zero contrast.
    labels_t, margin_t, r_t = synthetic({1: (5, 45), 4: (40, 10), 9: (40, 10)}, seed=2)
    res = class_resilience(r_t, margin_t, labels_t, 10, 1, (4, 9), bins)
    assert res.contrast_raw == pytest.approx((5 * 0.5 + 45) / 50 - (40 * 0.5 + 10) / 50)
    assert res.contrast_standardized == pytest.approx(0.0, abs=1e-12)


def test_empty_weighted_bin_is_undefined_not_zero():
    from fathom.audit.resilience import MarginBins

    bins = MarginBins(edges=np.array([2.0]), weights=np.array([0.5, 0.5]))
    labels = np.array([1, 1, 4, 4, 9, 9])
    margin = np.array([1.0, 3.0, 1.0, 3.0, 1.0, 1.0])  # class 9 has nothing above 2
    r = np.ones(6)
    res = class_resilience(r, margin, labels, 10, 1, (4, 9), bins)
    assert res.standardized_means[9] is None
    assert res.contrast_standardized is None
    assert res.contrast_raw == pytest.approx(0.0)


def test_bad_contrast_class_and_bins():
    with pytest.raises(FathomError, match=r"outside 0\.\.9"):
        class_resilience(
            np.ones(2),
            np.ones(2),
            np.array([1, 4]),
            10,
            1,
            (4, 12),
            fit_margin_bins(np.ones(2), 1),
        )
    with pytest.raises(FathomError, match="fewer bins"):
        fit_margin_bins(np.ones(3), n_bins=5)
