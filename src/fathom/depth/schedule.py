"""Drop schedules: epoch -> drop probability per branch (:mod:`fathom.depth`)."""

from __future__ import annotations

from dataclasses import dataclass

from fathom.depth.residual import check_drop_prob
from fathom.errors import FathomError


@dataclass(frozen=True)
class DropSchedule:
    """Per-branch drop probabilities as a function of the epoch (0-based, fractional ok).

    kind:
      * ``constant``: ``p_l(e) = p_l``
      * ``linear_decrease``: ``p_l(e) = p_l * max(0, 1 - e / end_epoch)`` (zero at ``end_epoch``)
      * ``none``: dense, every ``p_l = 0``
    """

    kind: str
    probs: tuple[float, ...]
    end_epoch: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in {"constant", "linear_decrease", "none"}:
            raise FathomError(
                f"unknown drop schedule {self.kind!r}; use constant, linear_decrease or none"
            )
        # Stored as Python floats: numpy and 0-d torch scalars are accepted, and ``at`` then
        # hands the trainer and set_drop_probs plain floats.
        checked = tuple(
            check_drop_prob(p, f"branch {i} of the drop schedule") for i, p in enumerate(self.probs)
        )
        object.__setattr__(self, "probs", checked)
        if self.kind == "linear_decrease" and (self.end_epoch is None or self.end_epoch <= 0):
            raise FathomError("linear_decrease needs a positive end_epoch (the last epoch)")

    def at(self, epoch: float) -> tuple[float, ...]:
        if self.kind == "none":
            return tuple(0.0 for _ in self.probs)
        if self.kind == "constant":
            return self.probs
        assert self.end_epoch is not None
        factor = max(0.0, 1.0 - epoch / self.end_epoch)
        return tuple(p * factor for p in self.probs)


def huang_linear_in_depth(num_branches: int, p_last: float) -> tuple[float, ...]:
    """Huang et al.'s rule: ``p_l = l / L * p_L`` for branches ``l = 1..L`` (``p_L`` in [0, 1))."""
    p = check_drop_prob(p_last, "the last branch (huang_linear_in_depth)")
    return tuple((i + 1) / num_branches * p for i in range(num_branches))
