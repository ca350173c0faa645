"""Per-example routing to a reduced network, and the shuffled control it must beat.

Features: the image average-pooled to a ``7 x 7`` grid per channel (49 intensities in [0, 1]
per channel for uint8 pixels), cheap next to any mask. No label and no full-model output is used.

Fitting (validation only; test is untouched):

1. Split validation examples at random into a *fit* half and a *calibration* half.
2. Target of a fit example: the cheapest mask (fewest MACs, ties to the lower index) that
   classifies it correctly, or the full network when none does.
3. A shallow ``sklearn`` decision tree on the features learns that target; its leaves
   partition feature space.
4. Calibration: in each leaf ``L`` choose the cheapest mask ``m`` with
   ``err_L(m) - err_L(full) <= tolerance`` on the calibration examples of ``L`` (the full
   network when ``L`` holds none). Every leaf meeting it bounds the calibration error
   increase of the whole policy by ``tolerance``.

Evaluation on test, for the routed assignment ``a_i``::

    err        = mean_i [not correct_{a_i, i}]
    increase   = err - err_full                     (tolerance held iff increase <= tolerance)
    cost       = mean_i MACs(a_i) / MACs(full)

Matched-cost shuffled control: the same multiset of assignments, randomly permuted across
test examples (``n_permutations`` times) - identical cost, no link between an example's
features and its mask. One-sided permutation p-value of the router's advantage::

    p = (1 + #{π : err_π <= err_router}) / (1 + n_permutations)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fathom.errors import FathomError, install_hint

_SKLEARN_HINT = install_hint("audit")


def require_sklearn() -> Any:
    """The ``sklearn.tree`` module, or a FathomError naming the extra to install."""
    try:
        from sklearn import tree
    except ImportError:
        raise FathomError(
            "routing needs scikit-learn, which is not installed; install the audit extra with "
            f"`{_SKLEARN_HINT}` (or run the audit with --no-router)"
        ) from None
    return tree


def pooled_features(x: torch.Tensor, grid: int = 7) -> np.ndarray:
    """``[N, C·grid²]`` average intensities of square images on a ``grid x grid`` pooling.

    Accepts ``[N, C, H, W]`` (every channel pooled), or single-channel ``[N, H, W]`` and flat
    ``[N, H·W]`` with a square ``H·W``; uint8 pixels are divided by 255.
    """
    n = x.shape[0]
    if x.dim() == 4 and x.shape[2] == x.shape[3]:
        img = x.float()
    else:
        flat = x.reshape(n, -1)
        side = round(flat.shape[1] ** 0.5)
        if side * side != flat.shape[1]:
            raise FathomError(
                f"pooled features need square images ([N, C, H, H], [N, H, H] or flat [N, H*H]); "
                f"got shape {list(x.shape)}"
            )
        img = flat.reshape(n, 1, side, side).float()
    if x.dtype == torch.uint8:
        img = img / 255.0
    pooled = F.adaptive_avg_pool2d(img, grid)
    return pooled.reshape(n, -1).cpu().numpy().astype(np.float64)


def _cost_order(costs: np.ndarray) -> np.ndarray:
    """Mask indices from cheapest to dearest (stable: ties keep the lower index first)."""
    return np.argsort(np.asarray(costs), kind="stable")


def cheapest_correct(correct: np.ndarray, costs: np.ndarray, full_index: int) -> np.ndarray:
    """For each example the cheapest mask classifying it correctly, else ``full_index``."""
    order = _cost_order(costs)
    ok = correct[order]  # [M, N] rows cheapest first
    any_ok = ok.any(axis=0)
    first = order[ok.argmax(axis=0)]
    return np.where(any_ok, first, full_index)


def cheapest_within_tolerance(
    correct: np.ndarray, costs: np.ndarray, full_index: int, tolerance: float
) -> int:
    """Cheapest mask ``m`` with ``err(m) - err(full) <= tolerance`` over the given examples."""
    err = 1.0 - correct.mean(axis=1)
    for m in _cost_order(costs):
        if err[m] - err[full_index] <= tolerance + 1e-12:
            return int(m)
    return full_index


@dataclass
class Router:
    """A fitted tree plus the calibrated mask of each of its leaves."""

    tree: Any
    leaf_mask: dict[int, int]
    full_index: int

    def assign(self, features: np.ndarray) -> np.ndarray:
        """Mask index of each example: the calibrated mask of the leaf it falls in."""
        leaves = self.tree.apply(features)
        return np.array([self.leaf_mask.get(int(v), self.full_index) for v in leaves])

    def describe(self) -> dict[str, Any]:
        return {
            "depth": int(self.tree.get_depth()),
            "leaves": int(self.tree.get_n_leaves()),
            "leaf_masks": {str(k): v for k, v in sorted(self.leaf_mask.items())},
        }


def fit_router(
    features: np.ndarray,
    correct: np.ndarray,
    costs: np.ndarray,
    full_index: int,
    tolerance: float,
    *,
    max_depth: int = 3,
    min_samples_leaf: int = 50,
    calibration_fraction: float = 0.5,
    seed: int = 0,
) -> Router:
    """Steps 1-4 of the module docstring on validation ``features [N, F]``, ``correct [M, N]``."""
    tree_mod = require_sklearn()
    n = features.shape[0]
    if correct.shape[1] != n:
        raise FathomError(f"{n} feature rows but correctness for {correct.shape[1]} examples")
    if tolerance < 0:
        raise FathomError(f"tolerance={tolerance} must be >= 0 (an error-rate increase)")
    if not 0.0 < calibration_fraction < 1.0:
        raise FathomError(f"calibration_fraction={calibration_fraction} must be in (0, 1)")
    perm = np.random.default_rng(seed).permutation(n)
    n_cal = round(calibration_fraction * n)
    cal, fit = perm[:n_cal], perm[n_cal:]
    if fit.size == 0 or cal.size == 0:
        raise FathomError(f"{n} validation examples are too few to fit and calibrate a router")
    target = cheapest_correct(correct[:, fit], costs, full_index)
    tree = tree_mod.DecisionTreeClassifier(
        max_depth=max_depth, min_samples_leaf=min_samples_leaf, random_state=seed
    )
    tree.fit(features[fit], target)
    leaves = tree.apply(features[cal])
    leaf_mask: dict[int, int] = {}
    for leaf in np.unique(tree.apply(features[fit])):
        in_leaf = cal[leaves == leaf]
        if in_leaf.size == 0:
            leaf_mask[int(leaf)] = full_index
        else:
            leaf_mask[int(leaf)] = cheapest_within_tolerance(
                correct[:, in_leaf], costs, full_index, tolerance
            )
    return Router(tree=tree, leaf_mask=leaf_mask, full_index=full_index)


def _policy_error(correct: np.ndarray, assignment: np.ndarray) -> float:
    """``mean_i [not correct_{a_i, i}]``."""
    return float(1.0 - correct[assignment, np.arange(assignment.size)].mean())


def _shuffled_errors(
    correct: np.ndarray, assignment: np.ndarray, n_permutations: int, seed: int
) -> np.ndarray:
    """Error of the matched-cost control: ``assignment`` permuted across examples."""
    rng = np.random.default_rng(seed)
    return np.array(
        [_policy_error(correct, rng.permutation(assignment)) for _ in range(n_permutations)]
    )


@dataclass(frozen=True)
class PolicyOutcome:
    """A routed (or static) policy scored on one split (see module docstring)."""

    error: float
    full_error: float
    increase: float
    tolerance: float
    tolerance_held: bool
    cost_fraction: float
    mean_macs: float
    mask_counts: dict[int, int]

    @property
    def accuracy(self) -> float:
        return 1.0 - self.error

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "error": self.error,
            "full_error": self.full_error,
            "error_increase": self.increase,
            "tolerance": self.tolerance,
            "tolerance_held": self.tolerance_held,
            "cost_fraction": self.cost_fraction,
            "mean_macs": self.mean_macs,
            "mask_counts": {str(k): v for k, v in sorted(self.mask_counts.items())},
        }


def score_policy(
    correct: np.ndarray,
    assignment: np.ndarray,
    costs: np.ndarray,
    full_index: int,
    tolerance: float,
) -> PolicyOutcome:
    """Error, increase over the full network, tolerance check and cost of ``assignment``."""
    err = _policy_error(correct, assignment)
    full_err = float(1.0 - correct[full_index].mean())
    macs = np.asarray(costs, dtype=np.float64)[assignment]
    values, counts = np.unique(assignment, return_counts=True)
    return PolicyOutcome(
        error=err,
        full_error=full_err,
        increase=err - full_err,
        tolerance=tolerance,
        tolerance_held=bool(err - full_err <= tolerance + 1e-12),
        cost_fraction=float(macs.mean() / float(costs[full_index])),
        mean_macs=float(macs.mean()),
        mask_counts={int(v): int(c) for v, c in zip(values, counts)},
    )


@dataclass(frozen=True)
class ControlComparison:
    """Router against its matched-cost shuffled control on one split."""

    router_error: float
    control_error_mean: float
    advantage: float
    p_value: float
    n_permutations: int
    alpha: float

    @property
    def beats_control(self) -> bool:
        return self.advantage > 0 and self.p_value < self.alpha

    def verdict(self) -> str:
        if self.beats_control:
            return (
                f"the router's error is below its matched-cost shuffled control by "
                f"{self.advantage:.4g} (permutation p = {self.p_value:.3g} < {self.alpha})"
            )
        return (
            "no advantage over the matched-cost shuffled control "
            f"(error difference {self.advantage:+.4g}, permutation p = {self.p_value:.3g})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "router_error": self.router_error,
            "control_error_mean": self.control_error_mean,
            "advantage": self.advantage,
            "p_value": self.p_value,
            "n_permutations": self.n_permutations,
            "alpha": self.alpha,
            "beats_control": self.beats_control,
            "verdict": self.verdict(),
        }


def compare_with_control(
    correct: np.ndarray,
    assignment: np.ndarray,
    n_permutations: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> ControlComparison:
    """Router error against ``n_permutations`` shuffles of its own assignment."""
    if n_permutations < 1:
        raise FathomError(f"n_permutations={n_permutations}: use at least one shuffle")
    err = _policy_error(correct, assignment)
    control = _shuffled_errors(correct, assignment, n_permutations, seed)
    p = (1 + int((control <= err).sum())) / (1 + n_permutations)
    return ControlComparison(
        router_error=err,
        control_error_mean=float(control.mean()),
        advantage=float(control.mean() - err),
        p_value=p,
        n_permutations=n_permutations,
        alpha=alpha,
    )
