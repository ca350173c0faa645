"""The epoch plan: every random draw and rate of an epoch, made ahead on the CPU.

Everything random about an epoch (the shuffle permutation, every branch gate) is drawn
from the run's seeded generators in exactly the order an eager loop would draw it, and the
per-step learning rates come from their one owner (:mod:`fathom.train.schedule`). A
stepper then consumes the plan without reading a device value back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fathom.config import OptimConfig
from fathom.depth import GateController
from fathom.train.schedule import epoch_lrs


def topology_index(kept: Sequence[bool]) -> int:
    """``sum_l kept_l * 2**l``: branch ``l`` kept <=> bit ``l`` set."""
    return sum(1 << i for i, k in enumerate(kept) if k)


def active_parameters(
    model: nn.Module, controller: GateController | None, kept: Sequence[bool]
) -> list[nn.Parameter]:
    """The parameters a step with these gates updates: all but those of skipped branches."""
    skipped: set[int] = set()
    if controller is not None:
        for branch, k in zip(controller.branches, kept, strict=True):
            if not k:
                skipped.update(id(p) for p in branch.parameters())
    return [p for p in model.parameters() if id(p) not in skipped]


@dataclass
class EpochPlan:
    """All randomness and schedules of one epoch, drawn ahead on the CPU."""

    epoch: int
    perm: torch.Tensor  # int64 [n_fit]
    kept: list[tuple[bool, ...]]  # per step (empty tuples without a controller)
    gain_values: list[tuple[float, ...]]  # per step, Python floats (the eager path's gains)
    gains: torch.Tensor  # float32 [steps, k] (the graph path's device copy)
    lrs: list[float]  # per step
    batch_size: int

    @property
    def steps(self) -> int:
        return len(self.lrs)

    def batch(self, i: int) -> slice:
        return slice(i * self.batch_size, (i + 1) * self.batch_size)

    def kept_bits(self) -> bytes:
        return bytes(int(k) for step in self.kept for k in step)


def plan_epoch(
    epoch: int,
    n_fit: int,
    batch_size: int,
    shuffle_gen: torch.Generator,
    controller: GateController | None,
    optim: OptimConfig,
) -> EpochPlan:
    """Draw epoch ``epoch`` (1-based): the permutation first, then every step's gates;
    the per-step rates come from :func:`fathom.train.schedule.epoch_lrs`."""
    perm = torch.randperm(n_fit, generator=shuffle_gen)
    steps = (n_fit + batch_size - 1) // batch_size
    kept: list[tuple[bool, ...]] = []
    values: list[tuple[float, ...]] = []
    for _ in range(steps):
        if controller is not None:
            kk, gg = controller.draw(epoch - 1)
        else:
            kk, gg = (), ()
        kept.append(kk)
        values.append(gg)
    k = controller.num_branches if controller is not None else 0
    gains = torch.tensor(values, dtype=torch.float32) if k else torch.ones(steps, 0)
    lrs = epoch_lrs(optim, epoch, steps)
    return EpochPlan(epoch, perm, kept, values, gains, lrs, batch_size)
