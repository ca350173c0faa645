"""Stochastic depth whose dropped branches are really not computed.

The function (per minibatch, one Bernoulli decision per branch, shared by the batch)::

    training:    y = bypass(x) + kept * branch(x) / survival      kept ~ Bernoulli(survival)
    evaluation:  y = bypass(x) + branch(x)                          (gain one)
    explicit:    y = bypass(x) + mask * branch(x)                   (mask in {0, 1}, gain one)

The control flow: when ``kept == 0`` the branch is *not called*: no matmul forward,
nothing recorded for backward, so its parameters receive ``grad is None`` and every
``torch.optim`` implementation (for-loop, foreach, fused) leaves them, their momentum
and their weight decay untouched on that step (``zero_grad(set_to_none=True)`` is
required, and is what :mod:`fathom.train` does).

Conventions differ elsewhere; say which one a recipe used when transferring it:

* Huang et al. (2016), *Deep Networks with Stochastic Depth*: survivors are unscaled in
  training and the test-time branch is weighted by its survival probability. Fathom uses
  inverse-survival gains in training and gain one at test time (same expectation of the
  pre-activation, different parameterisation).
* timm / torchvision ``DropPath`` / ``StochasticDepth``: the branch is computed and then
  multiplied by zero (per sample or per batch). That regularises but saves no work;
  :func:`drop_path_compute_then_mask` below imitates it for benchmarks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from fathom.errors import FathomError


def skippable_residual(
    x: torch.Tensor,
    branch: Callable[[torch.Tensor], torch.Tensor],
    bypass: Callable[[torch.Tensor], torch.Tensor],
    gain: float | torch.Tensor,
) -> torch.Tensor:
    """``bypass(x) + gain * branch(x)``, with ``branch`` not called when ``gain == 0``.

    ``gain`` is a Python float, or (CUDA-graph path, :mod:`fathom.train.fast`) a device
    scalar tensor of a *kept* branch whose value changes between graph replays; a tensor
    is never compared on the host.
    """
    if isinstance(gain, torch.Tensor):
        return bypass(x) + branch(x) * gain
    if gain == 0.0:
        return bypass(x)
    out = branch(x)
    if gain != 1.0:
        out = out * gain
    return bypass(x) + out


def drop_path_compute_then_mask(
    x: torch.Tensor,
    branch: Callable[[torch.Tensor], torch.Tensor],
    bypass: Callable[[torch.Tensor], torch.Tensor],
    keep: bool,
    survival: float,
) -> torch.Tensor:
    """timm-style batch DropPath: always compute the branch, then scale by keep/survival."""
    out = branch(x) * (float(keep) / survival)
    return bypass(x) + out


class Crop(nn.Module):
    """Keep the first ``features`` coordinates of the last dimension (a zero-parameter bypass)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., : self.features]

    def extra_repr(self) -> str:
        return f"features={self.features}"


class SkippableResidual(nn.Module):
    """``y = bypass(x) + gain * branch(x)``; ``gain == 0`` skips the branch entirely.

    ``gain`` is a plain Python float set by a :class:`GateController` (never a tensor, so
    the decision costs no device read). A fresh module has gain one (dense).
    """

    def __init__(self, branch: nn.Module, bypass: nn.Module | None = None) -> None:
        super().__init__()
        self.branch = branch
        self.bypass = bypass if bypass is not None else nn.Identity()
        self.gain: float = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return skippable_residual(x, self.branch, self.bypass, self.gain)

    def extra_repr(self) -> str:
        return f"gain={self.gain}"


def find_branches(model: nn.Module) -> list[SkippableResidual]:
    """All skippable branches of ``model`` in registration (shallow-to-deep) order."""
    return [m for m in model.modules() if isinstance(m, SkippableResidual)]


# ---------------------------------------------------------------------------------------
# Drop schedules: epoch -> drop probability per branch
# ---------------------------------------------------------------------------------------


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
        for i, p in enumerate(self.probs):
            if not (0.0 <= p < 1.0) or math.isnan(p):
                raise FathomError(
                    f"drop probability {p} for branch {i} is outside [0, 1): a branch that is "
                    "always dropped has no survival gain; use an explicit mask to delete it"
                )
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

    def mean_drop(self, epochs: int) -> tuple[float, ...]:
        """Mean drop probability per branch over epochs ``0 .. epochs-1``."""
        rows = [self.at(e) for e in range(epochs)]
        return tuple(sum(col) / len(rows) for col in zip(*rows, strict=True))


def huang_linear_in_depth(num_branches: int, p_last: float) -> tuple[float, ...]:
    """Huang et al.'s rule: ``p_l = l / L * p_L`` for branches ``l = 1..L``."""
    return tuple((i + 1) / num_branches * p_last for i in range(num_branches))


# ---------------------------------------------------------------------------------------
# The gate controller
# ---------------------------------------------------------------------------------------


class GateController:
    """Draws one keep/skip decision per branch per minibatch from its own generator.

    ``sample(epoch)`` sets each branch's gain to ``kept / survival`` and returns the
    decisions; ``dense()`` sets gain one everywhere; ``apply_mask(mask)`` sets gains
    ``mask[l] in {0, 1}`` (deletion, gain one); ``masked(mask)`` and ``dense_mode()`` are
    context managers that restore the previous gains.
    """

    def __init__(self, branches: Sequence[SkippableResidual], schedule: DropSchedule, seed: int):
        if len(schedule.probs) != len(branches):
            raise FathomError(
                f"drop schedule has {len(schedule.probs)} probabilities but the model has "
                f"{len(branches)} skippable branches"
            )
        self.branches = list(branches)
        self.schedule = schedule
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def num_branches(self) -> int:
        return len(self.branches)

    def draw(self, epoch: float) -> tuple[tuple[bool, ...], tuple[float, ...]]:
        """Draw decisions without touching the model: ``(kept, gains)``."""
        probs = self.schedule.at(epoch)
        u = torch.rand(len(probs), generator=self.generator, dtype=torch.float64).tolist()
        kept = tuple(ui >= p for ui, p in zip(u, probs, strict=True))
        gains = tuple((1.0 / (1.0 - p)) if k else 0.0 for k, p in zip(kept, probs, strict=True))
        return kept, gains

    def set_gains(self, gains: Sequence[float]) -> None:
        for b, g in zip(self.branches, gains, strict=True):
            b.gain = float(g)

    def gains(self) -> tuple[float, ...]:
        return tuple(b.gain for b in self.branches)

    def sample(self, epoch: float) -> tuple[bool, ...]:
        kept, gains = self.draw(epoch)
        self.set_gains(gains)
        return kept

    def dense(self) -> None:
        self.set_gains([1.0] * self.num_branches)

    def apply_mask(self, mask: Sequence[int | bool]) -> None:
        if len(mask) != self.num_branches:
            raise FathomError(
                f"mask has {len(mask)} entries, model has {self.num_branches} branches"
            )
        self.set_gains([1.0 if m else 0.0 for m in mask])

    @contextmanager
    def masked(self, mask: Sequence[int | bool]):
        saved = self.gains()
        try:
            self.apply_mask(mask)
            yield
        finally:
            self.set_gains(saved)

    @contextmanager
    def dense_mode(self):
        saved = self.gains()
        try:
            self.dense()
            yield
        finally:
            self.set_gains(saved)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "gains": list(self.gains())}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.set_gains(state["gains"])


@contextmanager
def branch_mask(model: nn.Module, mask: Sequence[int | bool]):
    """Evaluate ``model`` with branch ``l`` kept iff ``mask[l]`` (gain one); restores gains."""
    branches = find_branches(model)
    if len(mask) != len(branches):
        raise FathomError(f"mask has {len(mask)} entries, model has {len(branches)} branches")
    saved = [b.gain for b in branches]
    try:
        for b, m in zip(branches, mask, strict=True):
            b.gain = 1.0 if m else 0.0
        yield
    finally:
        for b, g in zip(branches, saved, strict=True):
            b.gain = g


@contextmanager
def dense_eval(model: nn.Module):
    """Dense evaluation mode: ``model.eval()``, every branch at gain one; restores both."""
    branches = find_branches(model)
    saved = [b.gain for b in branches]
    was_training = model.training
    try:
        model.eval()
        for b in branches:
            b.gain = 1.0
        yield
    finally:
        for b, g in zip(branches, saved, strict=True):
            b.gain = g
        model.train(was_training)
