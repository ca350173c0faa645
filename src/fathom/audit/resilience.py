"""Per-class resilience to branch deletion, raw and standardized to shared margins.

Among examples the full model classifies correctly, the resilience of example ``i`` is the
fraction of the masks of a given size (default: keeping two of four branches) under which
it stays correct::

    r_i = (1/|K|) Σ_{m ∈ K} correct_mi          K = {masks keeping exactly `keep` branches}

Class mean ``R_c = mean_{i: y_i=c, full correct} r_i``. The predeclared contrast (default
digit 1 against the mean of digits 4 and 9)::

    Δ_raw = R_a - mean_{b ∈ B} R_b

Classes differ in how confident the full model is, and confident examples survive deletion
more often. The standardized contrast compares the classes on one shared distribution of
full-model confidence margins (``margin_i = z_i,y_i - max_{c≠y_i} z_ic``). On validation,
pool the full-correct examples of the contrast classes, cut their margins at quantiles into
``n_bins`` bins and take each bin's share ``w_b``; those edges and weights are then applied
unchanged to test::

    R_c^std = Σ_b w_b · mean_{i: y_i=c, full correct, margin_i ∈ bin b} r_i
    Δ_std   = R_a^std - mean_{b ∈ B} R_b^std

``R_c^std`` is undefined (``None``) when class ``c`` has no example in a bin of positive
weight. Coarse margin adjustment is descriptive: it does not show that confidence causes
the class difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fathom.errors import FathomError


def resilience_per_example(
    correct: np.ndarray, masks: np.ndarray, full_index: int, keep: int
) -> np.ndarray:
    """``r_i`` over the masks keeping exactly ``keep`` branches; NaN where the full model errs."""
    sizes = masks.sum(axis=1)
    chosen = sizes == keep
    if not chosen.any():
        raise FathomError(
            f"no evaluated mask keeps exactly {keep} of {masks.shape[1]} branches; choose "
            f"--keep between 0 and {masks.shape[1]}"
        )
    r = correct[chosen].mean(axis=0).astype(np.float64)
    return np.where(correct[full_index], r, np.nan)


def class_means(resilience: np.ndarray, labels: np.ndarray, classes: int) -> list[float | None]:
    """``R_c`` for ``c = 0 .. classes-1``; ``None`` for a class with no full-correct example."""
    out: list[float | None] = []
    for c in range(classes):
        vals = resilience[(labels == c) & ~np.isnan(resilience)]
        out.append(float(vals.mean()) if vals.size else None)
    return out


def contrast(values: Sequence[float | None], a: int, b: Sequence[int]) -> float | None:
    """``values[a] - mean(values[b])``; ``None`` when any term is undefined."""
    terms = [values[a], *(values[c] for c in b)]
    if any(t is None for t in terms):
        return None
    return float(values[a]) - float(np.mean([values[c] for c in b]))


@dataclass(frozen=True)
class MarginBins:
    """Inner bin edges (``n_bins - 1``, bins open to ±∞ at the ends) and bin weights ``w_b``."""

    edges: np.ndarray
    weights: np.ndarray

    def assign(self, margin: np.ndarray) -> np.ndarray:
        """Bin index of each margin: ``searchsorted(edges, margin, side="right")``."""
        return np.searchsorted(self.edges, margin, side="right")

    def to_dict(self) -> dict[str, list[float]]:
        return {"inner_edges": self.edges.tolist(), "weights": self.weights.tolist()}


def fit_margin_bins(margin: np.ndarray, n_bins: int) -> MarginBins:
    """Quantile edges of ``margin`` (the pooled validation population) and each bin's share."""
    margin = margin[~np.isnan(margin)]
    if n_bins < 1:
        raise FathomError(f"n_bins={n_bins}: use at least one margin bin")
    if margin.size < n_bins:
        raise FathomError(
            f"{margin.size} validation examples cannot fill {n_bins} margin bins; use fewer bins"
        )
    edges = np.quantile(margin, np.arange(1, n_bins) / n_bins)
    bins = MarginBins(edges=np.asarray(edges, dtype=np.float64), weights=np.zeros(n_bins))
    counts = np.bincount(bins.assign(margin), minlength=n_bins).astype(np.float64)
    return MarginBins(edges=bins.edges, weights=counts / counts.sum())


def _standardized_class_mean(
    resilience: np.ndarray, margin: np.ndarray, labels: np.ndarray, c: int, bins: MarginBins
) -> float | None:
    """``R_c^std = Σ_b w_b · mean(r_i | y_i = c, full correct, margin_i in bin b)``."""
    member = (labels == c) & ~np.isnan(resilience)
    which = bins.assign(margin[member])
    r = resilience[member]
    total = 0.0
    for b, w in enumerate(bins.weights):
        if w == 0:
            continue
        in_bin = which == b
        if not in_bin.any():
            return None
        total += w * float(r[in_bin].mean())
    return total


@dataclass(frozen=True)
class ResilienceResult:
    """Class means and the predeclared contrast on one split."""

    class_means: list[float | None]
    class_counts: list[int]
    contrast_raw: float | None
    standardized_means: dict[int, float | None]
    contrast_standardized: float | None

    def to_dict(self) -> dict:
        return {
            "class_means": self.class_means,
            "class_counts": self.class_counts,
            "contrast_raw": self.contrast_raw,
            "standardized_means": {str(c): v for c, v in self.standardized_means.items()},
            "contrast_standardized": self.contrast_standardized,
        }


def contrast_population(
    resilience: np.ndarray, labels: np.ndarray, a: int, b: Sequence[int]
) -> np.ndarray:
    """Boolean selector of the full-correct examples of the contrast classes ``{a} ∪ B``."""
    return np.isin(labels, [a, *b]) & ~np.isnan(resilience)


def class_resilience(
    resilience: np.ndarray,
    margin: np.ndarray,
    labels: np.ndarray,
    classes: int,
    a: int,
    b: Sequence[int],
    bins: MarginBins | None,
) -> ResilienceResult:
    """Raw class means, raw contrast and margin-standardized contrast with given ``bins``
    (``None``: too few full-correct contrast examples for bins; standardized values null)."""
    for c in (a, *b):
        if not 0 <= c < classes:
            raise FathomError(f"contrast class {c} is outside 0..{classes - 1}; pick valid digits")
    means = class_means(resilience, labels, classes)
    counts = [int(((labels == c) & ~np.isnan(resilience)).sum()) for c in range(classes)]
    std = {
        c: None if bins is None else _standardized_class_mean(resilience, margin, labels, c, bins)
        for c in (a, *b)
    }
    std_values: list[float | None] = [std.get(c) for c in range(classes)]
    return ResilienceResult(
        class_means=means,
        class_counts=counts,
        contrast_raw=contrast(means, a, b),
        standardized_means=std,
        contrast_standardized=contrast(std_values, a, b),
    )
