"""Stochastic depth whose dropped branches are really not computed.

The function (per call, one Bernoulli decision per branch, shared by the batch)::

    training:    y = bypass(x) + kept * branch(x) / (1 - p)      kept ~ Bernoulli(1 - p)
    evaluation:  y = bypass(x) + branch(x)                        (gain one, always)
    explicit:    y = bypass(x) + mask * branch(x)                 (mask in {0, 1}, gain one, any mode)

:class:`SkippableResidual` behaves like a PyTorch module: in ``train()`` a module with
``p > 0`` draws its own decision on every forward from its own generator; in ``eval()``
every branch has gain one whatever was drawn before; the generator state lives in
``state_dict()`` (``<name>._extra_state``, a ``uint8`` tensor), so a saved and loaded model
resumes the same decision sequence. Precedence of what decides a forward's gain:

1. an explicit mask (:func:`branch_mask`), in either mode;
2. in ``eval()``: gain one;
3. a gain set from outside (``module.gain``, by a :class:`GateController` or the trainer's
   plans drawn ahead, :mod:`fathom.train.fast`; a device tensor on the CUDA-graph path);
4. the module's own draw (``p > 0``), or gain one (``p == 0``).

The control flow: when ``kept == 0`` the branch is *not called*: no matmul forward,
nothing recorded for backward, so its parameters receive ``grad is None`` and every
``torch.optim`` implementation (for-loop, foreach, fused; SGD, Adam, AdamW) leaves them,
their momentum, their weight decay, their Adam moments and step counts untouched on that
step (``zero_grad(set_to_none=True)`` is required; it is torch's default and what
:mod:`fathom.train` does).

A plain loop with a schedule (the drop probabilities may change every epoch)::

    model = nn.Sequential(nn.Linear(8, 16), SkippableResidual(nn.Linear(16, 16), p=0.2, seed=0),
                          nn.Linear(16, 3))
    for epoch in range(epochs):
        set_drop_probs(model, [0.2 * (1 - epoch / epochs)])
        model.train()          # each forward drops the branch with probability p
        ...
        model.eval()           # dense: gain one

``torch.compile``: the decision is a host-side draw in a function excluded from tracing
(:func:`torch.compiler.disable`), so a compiled model graph-breaks around it and keeps the
eager semantics (the same decisions from the same generator, a dropped branch not run);
``fullgraph=True`` refuses the graph break with torch's ``Unsupported`` error quoting
:data:`COMPILE_BREAK_REASON`. A module whose gain is set from outside, or with ``p = 0``, or
in ``eval()``, draws nothing and compiles whole. A self-sampling module cannot be captured in a
CUDA graph (the draw would be frozen at capture): set its gains from outside, as the
trainer's graph path does.

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


def check_drop_prob(p: float, where: str = "SkippableResidual") -> float:
    """``p`` as a float in ``[0, 1)``, or a FathomError naming the problem and the fix."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise FathomError(
            f"drop probability {p!r} of {where} is outside [0, 1): p = 1 would drop the branch "
            "on every step and leave no survival gain 1/(1-p); delete a branch with "
            "fathom.depth.branch_mask(model, mask) instead"
        )
    return float(p)


def survival_gain(kept: bool, p: float) -> float:
    """The training gain of one decision: ``kept / (1 - p)`` (``0.0`` when dropped)."""
    return 1.0 / (1.0 - p) if kept else 0.0


COMPILE_BREAK_REASON = (
    "fathom.depth.SkippableResidual draws its stochastic-depth decision on the host (a graph "
    "break); compile without fullgraph=True, or set module.gain (or p = 0) to compile it whole"
)


def _uniform(generator: torch.Generator) -> float:
    """``u ~ U[0, 1)`` in float64 from ``generator``, read on the host."""
    return torch.rand((), generator=generator, dtype=torch.float64).item()


_uniform_outside_compile = torch.compiler.disable(_uniform, reason=COMPILE_BREAK_REASON)


def draw_kept(generator: torch.Generator, p: float) -> bool:
    """One host-side Bernoulli decision ``kept = [u >= p]``, ``u ~ U[0, 1)`` in float64.

    The same rule as :meth:`GateController.draw`. Under ``torch.compile`` the draw runs in a
    function excluded from tracing (a graph break), so a compiled model decides exactly as
    the eager one; eagerly it is called directly (the exclusion wrapper costs more than the
    draw). Refused inside CUDA-graph capture, where the decision would be frozen.
    """
    if torch.compiler.is_compiling():
        return _uniform_outside_compile(generator) >= p
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        raise FathomError(
            "a self-sampling SkippableResidual (p > 0, no gain set) cannot be captured in a "
            "CUDA graph: its host-side draw would be frozen at capture; draw the gates ahead "
            "and set module.gain per topology, as fathom.train.fast does"
        )
    return _uniform(generator) >= p


class SkippableResidual(nn.Module):
    """``y = bypass(x) + gain * branch(x)``; ``gain == 0`` skips the branch entirely.

    ``p``: drop probability of the module's own decisions in ``train()`` (``[0, 1)``,
    settable at any time, e.g. per epoch). ``seed``: seeds its generator; ``None`` seeds it
    at its first draw from torch's global generator (so ``torch.manual_seed`` makes a run
    reproducible and distinct branches draw independently). ``gain`` (``None`` unless set
    from outside) and ``mask`` (``None`` unless set by :func:`branch_mask`) override the
    draw as the module docstring orders them.
    """

    def __init__(
        self,
        branch: nn.Module,
        bypass: nn.Module | None = None,
        p: float = 0.0,
        *,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.branch = branch
        self.bypass = bypass if bypass is not None else nn.Identity()
        self.p = p
        self.gain: float | torch.Tensor | None = None
        self.mask: bool | None = None
        self.generator: torch.Generator | None = None
        if seed is not None:
            self.generator = torch.Generator().manual_seed(int(seed))

    @property
    def p(self) -> float:
        return self._p

    @p.setter
    def p(self, value: float) -> None:
        self._p = check_drop_prob(value)

    def decide(self) -> float | torch.Tensor:
        """This forward's gain (module docstring: mask, eval, outside gain, own draw)."""
        if self.mask is not None:
            return 1.0 if self.mask else 0.0
        if not self.training:
            return 1.0
        if self.gain is not None:
            return self.gain
        if self._p == 0.0:
            return 1.0
        return survival_gain(draw_kept(self._generator(), self._p), self._p)

    def _generator(self) -> torch.Generator:
        if self.generator is None:
            seed = int(torch.randint(0, 2**62, ()).item())
            self.generator = torch.Generator().manual_seed(seed)
        return self.generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return skippable_residual(x, self.branch, self.bypass, self.decide())

    # -- state: the generator travels in state_dict() as "<prefix>_extra_state" ----------
    def get_extra_state(self) -> torch.Tensor:
        """The generator state (``uint8``; empty while not yet seeded)."""
        if self.generator is None:
            return torch.empty(0, dtype=torch.uint8)
        return self.generator.get_state()

    def set_extra_state(self, state: torch.Tensor) -> None:
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise FathomError(
                "SkippableResidual extra state must be the uint8 generator state written by "
                f"state_dict(), got {type(state).__name__}"
            )
        if state.numel() == 0:
            self.generator = None
            return
        self.generator = torch.Generator()
        self.generator.set_state(state.detach().cpu().clone())

    def extra_repr(self) -> str:
        parts = [f"p={self._p:g}"]
        if self.gain is not None:
            parts.append(f"gain={self.gain}")
        if self.mask is not None:
            parts.append(f"mask={int(self.mask)}")
        return ", ".join(parts)


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
            check_drop_prob(p, f"branch {i} of the drop schedule")
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

    It drives the model from outside (module docstring, precedence 3): ``sample(epoch)``
    sets each branch's ``gain`` to ``kept / survival`` and returns the decisions;
    ``release()`` hands every branch back to its own behaviour (``gain = None``);
    ``apply_mask(mask)`` sets explicit masks (deletion, gain one, any mode); ``masked(mask)``
    and ``dense_mode()`` are context managers that restore what they change.
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
        """Draw decisions without touching the model: ``(kept, gains)``, ``kept = [u >= p]``."""
        probs = self.schedule.at(epoch)
        u = torch.rand(len(probs), generator=self.generator, dtype=torch.float64).tolist()
        kept = tuple(ui >= p for ui, p in zip(u, probs, strict=True))
        gains = tuple(survival_gain(k, p) for k, p in zip(kept, probs, strict=True))
        return kept, gains

    def set_gains(self, gains: Sequence[float | torch.Tensor | None]) -> None:
        for b, g in zip(self.branches, gains, strict=True):
            b.gain = g if g is None or isinstance(g, torch.Tensor) else float(g)

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

    @contextmanager
    def dense_mode(self):
        """Gain one on every branch (set from outside), restoring the previous gains."""
        saved = self.gains()
        try:
            self.set_gains([1.0] * self.num_branches)
            yield
        finally:
            self.set_gains(saved)

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


@contextmanager
def dense_eval(model: nn.Module):
    """Dense evaluation mode: ``model.eval()`` and no mask (every branch at gain one).

    Gains set from outside are ignored in ``eval()`` and left as they were; the mode and
    the masks are restored on exit.
    """
    branches = find_branches(model)
    saved = [b.mask for b in branches]
    was_training = model.training
    try:
        model.eval()
        set_masks(branches, [None] * len(branches))
        yield
    finally:
        set_masks(branches, saved)
        model.train(was_training)
