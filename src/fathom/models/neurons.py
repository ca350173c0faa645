"""Leaky integrate-and-fire (LIF) neurons with an arctan surrogate gradient.

One timestep of the neuron (SpikingJelly's ``LIFNode`` with ``decay_input=True``)::

    charge:  h_t = v_{t-1} + (x_t - (v_{t-1} - v_reset)) / tau
    fire:    s_t = Θ(h_t - v_threshold)                     Θ(u) = 1 if u >= 0 else 0
    reset:   v_t = h_t * (1 - s_t) + v_reset * s_t          (hard reset)
             v_t = h_t - v_threshold * s_t                   (soft reset, "reset by subtraction")
    start:   v_0 = v_reset

With ``detach_reset=True`` the ``s_t`` inside the reset is a constant for differentiation
(the reset path carries no gradient), as in SpikingJelly's ``detach_reset``.

The surrogate: the forward value is the exact step Θ(u); every derivative (reverse- and
forward-mode, so Jacobian-vector products too) is that of
``g(u) = arctan(π α u / 2) / π + 1/2``, i.e. ``g'(u) = (α / 2) / (1 + (π α u / 2)^2)``,
``g'(0) = α / 2``. It is written as ``Θ(u) + (g(u) - stop_grad(g(u)))``: the bracket is
exactly zero in value, so spikes are exactly 0 or 1, and the expression is differentiable
to any order (the Lyapunov regularizer differentiates through a JVP of it).

The state lives only inside one call: every call starts at ``v_0 = v_reset``, so state is
reset between batches by construction (there is no membrane buffer to forget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from fathom.errors import FathomError

_RESET_MODES: tuple[str, ...] = ("hard", "soft")


def spike(u: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    """Heaviside step ``Θ(u)`` (``Θ(0) = 1``) forward, arctan surrogate derivative.

    ``Θ(u) + (g(u) - stop_grad(g(u)))`` with ``g(u) = arctan(π α u / 2) / π + 1/2``, so the
    backward and forward-mode derivative is ``g'(u) = (α / 2) / (1 + (π α u / 2)^2)``.
    """
    step = (u >= 0).to(u.dtype)
    g = torch.atan((math.pi * alpha / 2) * u) / math.pi
    return step + (g - g.detach())


def _lif_step(
    v: torch.Tensor,
    x: torch.Tensor,
    *,
    tau: float = 2.0,
    v_threshold: float = 1.0,
    v_reset: float = 0.0,
    reset: str = "hard",
    detach_reset: bool = False,
    alpha: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One LIF timestep ``(v_{t-1}, x_t) -> (s_t, v_t)``; formulas in the module docstring."""
    h = v + (x - (v - v_reset)) / tau
    s = spike(h - v_threshold, alpha)
    s_reset = s.detach() if detach_reset else s
    if reset == "hard":
        return s, h * (1 - s_reset) + v_reset * s_reset
    return s, h - v_threshold * s_reset


def lif_multistep(
    x: torch.Tensor,
    *,
    tau: float = 2.0,
    v_threshold: float = 1.0,
    v_reset: float = 0.0,
    reset: str = "hard",
    detach_reset: bool = False,
    alpha: float = 2.0,
) -> torch.Tensor:
    """Spikes ``s[:, t]`` for inputs ``x[:, t]``, ``x`` shaped ``[B, T, ...]``, ``v_0 = v_reset``."""
    v = torch.full_like(x[:, 0], v_reset)
    spikes = []
    for t in range(x.shape[1]):
        s, v = _lif_step(
            v,
            x[:, t],
            tau=tau,
            v_threshold=v_threshold,
            v_reset=v_reset,
            reset=reset,
            detach_reset=detach_reset,
            alpha=alpha,
        )
        spikes.append(s)
    return torch.stack(spikes, dim=1)


@dataclass(frozen=True)
class LIFConfig:
    """LIF constants; defaults are SpikingJelly's (τ = 2, threshold 1, reset to 0, α = 2)."""

    tau: float = 2.0
    v_threshold: float = 1.0
    v_reset: float = 0.0
    reset: str = "hard"
    detach_reset: bool = False
    alpha: float = 2.0

    def __post_init__(self) -> None:
        if self.reset not in _RESET_MODES:
            raise FathomError(
                f"unknown LIF reset {self.reset!r}; use one of {', '.join(_RESET_MODES)}"
            )
        if self.tau <= 1.0:
            raise FathomError(
                f"LIF tau must be > 1 (a leak factor 1/tau below one), got {self.tau}"
            )
        if self.alpha <= 0:
            raise FathomError(f"surrogate alpha must be positive, got {self.alpha}")


class LIF(nn.Module):
    """LIF neurons over ``timesteps`` on a time-folded batch ``[B * T, ...]`` (batch-major).

    Thin wrapper over :func:`lif_multistep`; the fold is ``index = b * T + t``.
    """

    def __init__(self, timesteps: int, config: LIFConfig | None = None) -> None:
        super().__init__()
        if timesteps < 1:
            raise FathomError(f"LIF needs timesteps >= 1, got {timesteps}")
        self.timesteps = timesteps
        self.config = config or LIFConfig()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        s = lif_multistep(
            x.unflatten(0, (-1, self.timesteps)),
            tau=c.tau,
            v_threshold=c.v_threshold,
            v_reset=c.v_reset,
            reset=c.reset,
            detach_reset=c.detach_reset,
            alpha=c.alpha,
        )
        return s.flatten(0, 1)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"timesteps={self.timesteps}, tau={c.tau}, v_threshold={c.v_threshold}, "
            f"v_reset={c.v_reset}, reset={c.reset}, detach_reset={c.detach_reset}, "
            f"surrogate=arctan(alpha={c.alpha})"
        )
