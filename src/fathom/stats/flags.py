"""Failure flags for one run: it diverged, did not complete, failed or is undetermined
against chance (:mod:`fathom.stats.chance`), or does not fit.

Flags are descriptive strings; :data:`EXCLUDING_FLAGS` remove a run from comparisons (a
diverged or at-chance run says nothing about how good its method is, only that it failed;
an undetermined one may not decide a verdict either way). ``not_fitting`` and
``ce_near_chance`` are caveats printed next to a comparison.
"""

from __future__ import annotations

import math

from fathom.errors import FathomError
from fathom.stats.chance import accuracy_state
from fathom.stats.rules import DEFAULT_RULES, Rules

CHANCE_CE_TOLERANCE = 0.05
"""Caveat ``ce_near_chance`` when the fitting CE ``>= (1 - 0.05) · ln C``: the geometric
mean of the probability given to the true class is at most ``C^0.05`` times the uniform
guess. A caveat only: whether a run trained is decided by its accuracy (``fathom.stats.chance``)."""

NOT_FITTING_ACCURACY = 0.5
"""A run is ``not_fitting`` when its final fitting-set accuracy is below 0.5 (a caveat)."""

EXCLUDING_FLAGS = (
    "diverged",
    "incomplete",
    "at_chance",
    "near_chance",
    "n_eval_unknown",
    "one_class",
)
"""Flags that remove a run from comparisons."""

RUN_STATUSES = ("complete", "diverged", "failed", "running", "interrupted")


def _non_finite(x: float | None) -> bool:
    return x is not None and not math.isfinite(float(x))


def failure_flags(
    *,
    status: str,
    test_acc: float | None,
    train_ce: float | None,
    classes: int,
    n_eval: int | None,
    fit_acc: float | None = None,
    rules: Rules = DEFAULT_RULES,
    fit_threshold: float = NOT_FITTING_ACCURACY,
) -> list[str]:
    """Flags of one run, in a fixed order (``n_eval``: the test-set size the accuracy is on).

    * ``diverged``: ``status == "diverged"`` or any given metric is NaN/inf (nothing else);
    * ``incomplete``: ``status`` is ``"failed"``, ``"running"`` or ``"interrupted"`` (no
      final result);
    * ``at_chance``: :func:`~fathom.stats.chance.accuracy_state` (``chance_test``'s state) says *failed*;
    * ``near_chance``: it says *undetermined* (the run decides no verdict);
    * ``n_eval_unknown``: an accuracy without its evaluation-set size: it cannot be judged;
    * ``one_class`` (alone): ``classes < 2``, a task without a chance level; bad input that
      excludes the run from every comparison (named there), never an exception;
    * ``ce_near_chance`` (caveat): ``train_ce >= (1 - 0.05) · ln C``;
    * ``not_fitting`` (caveat): ``fit_acc < fit_threshold``.

    A metric given as ``None`` is unknown and raises no flag by itself.
    """
    if status not in RUN_STATUSES:
        raise FathomError(f"unknown run status {status!r}; expected one of {RUN_STATUSES}")
    if classes < 2:
        return ["one_class"]
    if n_eval is not None and n_eval < 1:
        raise FathomError(f"n_eval={n_eval!r}: an accuracy needs at least one test example")
    if status == "diverged" or any(_non_finite(x) for x in (test_acc, train_ce, fit_acc)):
        return ["diverged"]
    flags: list[str] = []
    if status in ("failed", "running", "interrupted"):
        flags.append("incomplete")
    if test_acc is not None:
        if n_eval is None:
            flags.append("n_eval_unknown")
        else:
            state = accuracy_state(test_acc, n_eval=n_eval, classes=classes, rules=rules)
            flags += {"failed": ["at_chance"], "undetermined": ["near_chance"]}.get(state, [])
    if train_ce is not None and train_ce >= (1.0 - CHANCE_CE_TOLERANCE) * math.log(classes):
        flags.append("ce_near_chance")
    if fit_acc is not None and fit_acc < fit_threshold:
        flags.append("not_fitting")
    return flags


def is_excluded(flags: list[str]) -> bool:
    """True when any flag removes the run from comparisons (:data:`EXCLUDING_FLAGS`)."""
    return any(f in EXCLUDING_FLAGS for f in flags)
