"""Failure flags for one run: it diverged, it sits at chance, or it does not fit.

Flags are descriptive strings; :data:`EXCLUDING_FLAGS` are the ones that remove a run
from comparisons (a diverged or at-chance run says nothing about how good its method
is, only that it failed). ``not_fitting`` is a caveat printed next to a comparison:
two underfitting runs can still be compared, the comparison says which underfits less.
"""

from __future__ import annotations

import math

from fathom.errors import FathomError

CHANCE_ACCURACY_FACTOR = 2.0
"""A run is at chance when its test accuracy is below ``2 / C`` (twice chance)."""

CHANCE_CE_TOLERANCE = 0.05
"""Relative tolerance for "CE near ln C": at chance when ``CE >= (1 - 0.05) · ln C``.

Rationale: CE = -mean log p(true class), so CE >= 0.95 ln C means the geometric mean of
the probability given to the true class is at most ``C^-0.95``, i.e. at most ``C^0.05``
times the uniform guess (1.12x for C = 10, 1.26x for C = 100): indistinguishable from
predicting the prior. CE above ln C (confidently wrong) is at or worse than chance and
is flagged too. A relative tolerance keeps the rule meaningful for C = 2, where an
absolute one such as ln 2 would flag every run.
"""

NOT_FITTING_ACCURACY = 0.5
"""A run is ``not_fitting`` when its final fitting-set accuracy is below 0.5.

Rationale: after the full training budget a network that cannot classify half of the
examples it is trained on has not fit its training set; every working run in the
reference studies (MNIST MLPs, CIFAR conv nets at depths that train) ends far above it.
"""

EXCLUDING_FLAGS = ("diverged", "at_chance", "incomplete")
"""Flags that remove a run from comparisons."""

_KNOWN_STATUSES = ("complete", "diverged", "failed", "running")


def _non_finite(x: float | None) -> bool:
    return x is not None and not math.isfinite(float(x))


def failure_flags(
    *,
    status: str,
    test_acc: float | None,
    train_ce: float | None,
    classes: int,
    fit_acc: float | None = None,
    chance_ce_tolerance: float = CHANCE_CE_TOLERANCE,
    fit_threshold: float = NOT_FITTING_ACCURACY,
) -> list[str]:
    """Flags of one run, in a fixed order: ``diverged``, ``incomplete``, ``at_chance``, ``not_fitting``.

    * ``diverged``: ``status == "diverged"`` or any given metric is NaN/inf.
    * ``incomplete``: ``status`` is ``"failed"`` or ``"running"`` (no final result).
    * ``at_chance``: ``test_acc < 2 / classes`` or ``train_ce >= (1 - tol) · ln(classes)``.
    * ``not_fitting``: ``fit_acc < fit_threshold``.

    Pass final values (or, for "stays at chance over the run", the best value reached).
    A metric given as ``None`` is unknown and raises no flag by itself.
    """
    if status not in _KNOWN_STATUSES:
        raise FathomError(f"unknown run status {status!r}; expected one of {_KNOWN_STATUSES}")
    if classes < 2:
        raise FathomError(f"classes={classes!r}: a classification task needs at least 2 classes")
    if not 0.0 <= chance_ce_tolerance < 1.0:
        raise FathomError(
            f"chance_ce_tolerance={chance_ce_tolerance!r} must be in [0, 1); default is "
            f"{CHANCE_CE_TOLERANCE}"
        )
    flags: list[str] = []
    if status == "diverged" or any(_non_finite(x) for x in (test_acc, train_ce, fit_acc)):
        flags.append("diverged")
        return flags
    if status in ("failed", "running"):
        flags.append("incomplete")
    chance_acc = CHANCE_ACCURACY_FACTOR / classes
    near_chance_ce = (1.0 - chance_ce_tolerance) * math.log(classes)
    if (test_acc is not None and test_acc < chance_acc) or (
        train_ce is not None and train_ce >= near_chance_ce
    ):
        flags.append("at_chance")
    if fit_acc is not None and fit_acc < fit_threshold:
        flags.append("not_fitting")
    return flags


def is_excluded(flags: list[str]) -> bool:
    """True when any flag removes the run from comparisons (:data:`EXCLUDING_FLAGS`)."""
    return any(f in EXCLUDING_FLAGS for f in flags)
