"""Driving the branches from outside: the gate controller, masks, dense evaluation.

See :mod:`fathom.depth` for the precedence of a mask, ``eval()``, an outside gain and a
module's own draw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from fathom.depth.residual import (
    SkippableResidual,
    check_convention,
    check_drop_prob,
    find_branches,
    set_gain,
    survival_gain,
)
from fathom.depth.schedule import DropSchedule
from fathom.errors import FathomError


class GateController:
    """Draws one keep/skip decision per branch per minibatch from its own generator.

    It drives the model from outside (module docstring, precedence 3): ``sample(epoch)``
    sets each branch's ``gain`` to ``kept / survival`` and returns the decisions;
    ``release()`` hands every branch back to its own behaviour (``gain = None``);
    ``apply_mask(mask)`` sets explicit masks (deletion, gain one, any mode); ``masked(mask)``
    is a context manager that restores what it changes. With ``convention = "huang"`` a kept
    branch's gain is one, and every branch's ``p`` follows the schedule of the epoch drawn
    (set when it changes), so ``eval()`` and masks weight it by the survival it trains with.
    """

    def __init__(
        self,
        branches: Sequence[SkippableResidual],
        schedule: DropSchedule,
        seed: int,
        convention: str = "inverse",
    ):
        if len(schedule.probs) != len(branches):
            raise FathomError(
                f"drop schedule has {len(schedule.probs)} probabilities but the model has "
                f"{len(branches)} skippable branches"
            )
        self.branches = list(branches)
        self.schedule = schedule
        self.generator = torch.Generator().manual_seed(seed)
        self.convention = check_convention(convention)
        self._probs_at: float | None = None
        if self.convention != "inverse":  # the branches weight themselves by 1 - p
            for b in self.branches:
                b.convention = self.convention
            self._set_probs(0.0)

    def _set_probs(self, epoch: float) -> None:
        """Each branch's ``p`` := the schedule's at ``epoch`` (``huang``: the survival its
        evaluation and masks weight it by is the one its training draws use)."""
        probs = self.schedule.at(epoch)
        for b, p in zip(self.branches, probs, strict=True):
            b.p = p
        self._probs_at = epoch

    @property
    def num_branches(self) -> int:
        return len(self.branches)

    def draw(self, epoch: float) -> tuple[tuple[bool, ...], tuple[float, ...]]:
        """Draw decisions without touching the model: ``(kept, gains)``, ``kept = [u >= p]``."""
        probs = self.schedule.at(epoch)
        u = torch.rand(len(probs), generator=self.generator, dtype=torch.float64).tolist()
        kept = tuple(ui >= p for ui, p in zip(u, probs, strict=True))
        if self.convention == "inverse":
            gains = tuple(survival_gain(k, p) for k, p in zip(kept, probs, strict=True))
            return kept, gains
        if epoch != self._probs_at:
            self._set_probs(epoch)
        gains = tuple(
            survival_gain(k, p, self.convention) for k, p in zip(kept, probs, strict=True)
        )
        return kept, gains

    def set_gains(self, gains: Sequence[float | torch.Tensor | None]) -> None:
        for b, g in zip(self.branches, gains, strict=True):
            set_gain(b, g if g is None or isinstance(g, torch.Tensor) else float(g))

    def gains(self) -> tuple[float | torch.Tensor | None, ...]:
        return tuple(b.gain for b in self.branches)

    def sample(self, epoch: float) -> tuple[bool, ...]:
        kept, gains = self.draw(epoch)
        self.set_gains(gains)
        return kept

    def release(self) -> None:
        """No gain set from outside: each branch follows ``train()``/``eval()`` and its ``p``."""
        self.set_gains([None] * self.num_branches)

    def apply_mask(self, mask: Sequence[int | bool]) -> None:
        set_masks(self.branches, mask)

    @contextmanager
    def masked(self, mask: Sequence[int | bool]):
        saved = [b.mask for b in self.branches]
        try:
            self.apply_mask(mask)
            yield
        finally:
            for b, m in zip(self.branches, saved, strict=True):
                b.mask = m

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "gains": list(self.gains())}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.set_gains(state["gains"])


def set_masks(branches: Sequence[SkippableResidual], mask: Sequence[int | bool | None]) -> None:
    """``branches[l].mask = mask[l]`` (``None`` clears it); a length mismatch is refused."""
    if len(mask) != len(branches):
        raise FathomError(
            f"mask has {len(mask)} entries, model has {len(branches)} branches "
            "(one entry per SkippableResidual, in registration order)"
        )
    for b, m in zip(branches, mask, strict=True):
        b.mask = None if m is None else bool(m)


def set_drop_probs(model: nn.Module, probs: Sequence[float]) -> None:
    """Set the drop probability ``p`` of every branch of ``model`` (e.g. once per epoch).

    ``probs`` has one entry per :class:`SkippableResidual`, in :func:`find_branches` order
    (a :class:`DropSchedule` gives them: ``set_drop_probs(model, schedule.at(epoch))``).
    """
    branches = find_branches(model)
    if len(probs) != len(branches):
        raise FathomError(
            f"{len(probs)} drop probabilities for {len(branches)} skippable branches; give one "
            "per SkippableResidual, in registration order"
        )
    checked = [check_drop_prob(p, f"branch {i}") for i, p in enumerate(probs)]
    for b, p in zip(branches, checked, strict=True):
        b.p = p


@contextmanager
def branch_mask(model: nn.Module, mask: Sequence[int | bool]):
    """Run ``model`` with branch ``l`` kept iff ``mask[l]`` (gain one, any mode); restores masks."""
    branches = find_branches(model)
    saved = [b.mask for b in branches]
    try:
        set_masks(branches, mask)
        yield
    finally:
        set_masks(branches, saved)


def enter_dense(model: nn.Module) -> Callable[[], None]:
    """Put ``model`` in dense evaluation mode: ``model.eval()`` and no mask (every branch at
    gain one; gains set from outside are ignored in ``eval()`` and left as they were).

    Returns the function that restores the previous mode of every module (not only the
    root's: a BatchNorm frozen in ``eval()`` inside a model in ``train()`` stays in ``eval()``)
    and the masks. The one definition of
    dense evaluation: :func:`dense_eval` (instruments) and the curvature float64 twin
    (which never restores) both call it.
    """
    branches = find_branches(model)
    saved = [b.mask for b in branches]
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    set_masks(branches, [None] * len(branches))

    def restore() -> None:
        set_masks(branches, saved)
        model.train(flags[0][1])  # a module's own train() override runs as it did
        for m, flag in flags:  # then every module's flag as found (a frozen BN in eval)
            if m.training is not flag:  # (most are already: train() set them)
                m.training = flag

    return restore


@contextmanager
def dense_eval(model: nn.Module):
    """Dense evaluation mode (:func:`enter_dense`) for the block; every module's mode and
    the masks restored."""
    restore = enter_dense(model)
    try:
        yield
    finally:
        restore()


@contextmanager
def state_kept(model: nn.Module, parameters: bool = False):
    """Every buffer (and with ``parameters`` every parameter) of every module as found after
    the block: the same tensor object under the same name, holding the same values (a
    forward that updates one in place, a call counter, running statistics in ``train()``,
    an ``Embedding(max_norm=...)`` renormalizing its rows, is undone; one that rebinds or
    registers one is put back)."""
    kinds = ("_buffers", "_parameters") if parameters else ("_buffers",)
    saved = [(m, kind, dict(getattr(m, kind))) for m in model.modules() for kind in kinds]
    values = [
        (t, t.detach().clone()) for _, _, held in saved for t in held.values() if t is not None
    ]
    try:
        yield
    finally:
        for m, kind, held in saved:
            now = getattr(m, kind)
            if now.keys() != held.keys() or any(now[k] is not t for k, t in held.items()):
                now.clear()
                now.update(held)
        with torch.no_grad():
            for t, v in values:
                if not torch.equal(t, v):
                    t.copy_(v)
