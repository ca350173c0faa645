"""SGD with momentum over a step's *active* parameters, with torch's own kernels.

``torch.optim.SGD`` (dampening 0, no Nesterov), for the parameters a step actually used::

    d = g + weight_decay * p;   b = momentum * b + d;   p = p - lr * b
    (first step of a parameter: b = d, a copy — torch's rule)

:class:`ActiveSGD` is what the eager and graph steppers run instead of ``loss.backward()``,
``optimizer.step()``, ``optimizer.zero_grad()``: the gradients come from
``torch.autograd.grad`` over the active parameters of the step's branch topology (all
parameters but those of skipped branches, a list built once per topology), so nothing is
accumulated into ``.grad``, nothing is zeroed, and ``optimizer.step()``'s per-call work
(grouping every parameter by device and dtype, checking each for a gradient) is not
repeated every step. The update issues the kernels ``torch.optim.SGD(foreach=True)`` issues,
in the same order, on the same momentum buffers (``optimizer.state[p]["momentum_buffer"]``,
so checkpoints and resumes are unchanged): the results agree bit for bit
(``tests/test_fast.py``). Skipped parameters (no gradient) get no momentum, no weight
decay and no update, as with torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fathom.train.plan import active_parameters


def sgd_momentum_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    bufs: list[torch.Tensor],
    lr: float | torch.Tensor,
    momentum: float,
    weight_decay: float,
    fused: bool = False,
) -> None:
    """``torch.optim.SGD`` (dampening 0, no Nesterov) for parameters whose buffers exist::

        d = g + weight_decay * p;   b = momentum * b + d;   p = p - lr * b

    ``lr`` may be a device scalar (graph capture: its value changes between replays).
    ``fused=True`` calls torch's single-kernel fused SGD (the kernel behind
    ``torch.optim.SGD(fused=True)``; it reads a tensor ``lr`` on the device): one pass over
    params, grads and buffers instead of four foreach passes.
    """
    if fused:
        torch._fused_sgd_(
            params,
            grads,
            bufs if momentum else [],
            weight_decay=weight_decay,
            momentum=momentum,
            lr=lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
            is_first_step=False,
        )
        return
    if weight_decay:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    if momentum:
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_add_(bufs, grads)
        direction = bufs
    else:
        direction = grads
    if isinstance(lr, torch.Tensor):
        torch._foreach_sub_(params, torch._foreach_mul(direction, lr))
    else:
        torch._foreach_add_(params, direction, alpha=-lr)


def plain_sgd_blocker(optimizer: torch.optim.Optimizer, model: nn.Module) -> str | None:
    """Why :class:`ActiveSGD` cannot stand in for ``optimizer`` (``None`` when it can).

    It can for ``torch.optim.SGD`` over exactly ``model.parameters()`` in one group, with
    foreach kernels, no dampening, no Nesterov, no maximize, no step hooks.
    """
    if type(optimizer) is not torch.optim.SGD:
        return f"{type(optimizer).__name__} is not torch.optim.SGD"
    if len(optimizer.param_groups) != 1:
        return "more than one parameter group"
    group = optimizer.param_groups[0]
    if [id(p) for p in group["params"]] != [id(p) for p in model.parameters()]:
        return "the optimizer's parameters are not model.parameters()"
    if group.get("foreach") is not True or group.get("fused") or group.get("differentiable"):
        return "not the foreach kernel"
    if group["dampening"] or group["nesterov"] or group["maximize"]:
        return "dampening, Nesterov or maximize"
    if optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks:
        return "optimizer step hooks"
    return None


class ActiveSGD:
    """The gradients and the SGD update of one step, over the step's active parameters."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.SGD,
        controller=None,
        fused: bool = False,
    ) -> None:
        group = optimizer.param_groups[0]
        self.model, self.optimizer, self.controller = model, optimizer, controller
        self.momentum, self.weight_decay = float(group["momentum"]), float(group["weight_decay"])
        self.fused = fused
        self._active: dict[tuple[bool, ...], list[nn.Parameter]] = {}
        self._ready: set[tuple[bool, ...]] = set()

    def params(self, kept: Sequence[bool]) -> list[nn.Parameter]:
        """The active parameters of topology ``kept`` (built once per topology)."""
        key = tuple(kept)
        params = self._active.get(key)
        if params is None:
            params = self._active[key] = active_parameters(self.model, self.controller, key)
        return params

    def ready(self, kept: Sequence[bool]) -> bool:
        """Every active parameter has a momentum buffer (then it keeps it for good)."""
        key = tuple(kept)
        if not self.momentum or key in self._ready:
            return True
        state = self.optimizer.state
        if all(state[p].get("momentum_buffer") is not None for p in self.params(key)):
            self._ready.add(key)
            return True
        return False

    def step(self, loss: torch.Tensor, kept: Sequence[bool], lr: float | torch.Tensor) -> None:
        """``d loss / d params`` of the active parameters, then the SGD update of those."""
        params = self.params(kept)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        if any(g is None for g in grads):  # a branch the model itself skipped (own draw)
            pairs = [(p, g) for p, g in zip(params, grads, strict=True) if g is not None]
            params, grads = [p for p, _ in pairs], [g for _, g in pairs]
        self.update(params, list(grads), lr)

    @torch.no_grad()
    def update(
        self, params: list[nn.Parameter], grads: list[torch.Tensor], lr: float | torch.Tensor
    ) -> None:
        """The SGD update of ``params`` (torch's first-step rule where a buffer is missing)."""
        if not self.momentum:
            sgd_momentum_(params, grads, [], lr, 0.0, self.weight_decay, self.fused)
            return
        state = self.optimizer.state
        bufs = [state[p].get("momentum_buffer") for p in params]
        if any(b is None for b in bufs):
            self._bootstrap(params, grads, bufs, lr)
        else:
            sgd_momentum_(params, grads, bufs, lr, self.momentum, self.weight_decay, self.fused)

    def _bootstrap(self, params, grads, bufs, lr) -> None:
        """torch's first-step rule for parameters without a buffer: ``b = d`` (a copy)."""
        if self.weight_decay:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        state = self.optimizer.state
        for p, d, b in zip(params, grads, bufs, strict=True):
            if b is None:
                state[p]["momentum_buffer"] = torch.clone(d).detach()
            else:
                b.mul_(self.momentum).add_(d)
        new = [state[p]["momentum_buffer"] for p in params]
        if isinstance(lr, torch.Tensor):
            torch._foreach_sub_(params, torch._foreach_mul(new, lr))
        else:
            torch._foreach_add_(params, new, alpha=-lr)
