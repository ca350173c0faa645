"""One optimizer step, written once: gather -> autocast forward -> cross-entropy -> gradients
-> update.

:class:`StepBody` is the step every cross-entropy stepper runs, the eager path and the CUDA
graph (captured, or run eagerly); the regularized step shares its batch (:meth:`StepBody.batch`)
and its torch-optimizer update (:func:`torch_update`) and computes its own gradients. Per step
``i`` of an :class:`~fathom.train.plan.EpochPlan`::

    x = augment(fit_x[idx_i]);  loss = CE(model(x).float(), fit_y[idx_i])   (mean, nats)
    plain SGD:        g = d loss / d θ_active;  ActiveSGD update of θ_active with lr_i
    other optimizers: loss.backward(); group["lr"] = lr_i; optimizer.step(); zero_grad(None)
    with clip_norm:   loss.backward(); clip_grad_norm_(θ, clip_norm); then the update

``CE`` is the run's loss (:func:`loss_for`): its ``[loss]`` table's over ``[N, C]`` logits
(``F.cross_entropy`` by default; :mod:`fathom.losses.labels`), or for a next-token model
:func:`fathom.models.gpt.token_cross_entropy` over ``[N, T, V]`` (mean nats per token).

The learning rate has one source, the plan (``plan.lrs``, :mod:`fathom.train.schedule`): it
reaches the update once, as the argument of :class:`fathom.train.sgd.ActiveSGD` or, for a torch
optimizer (which reads nothing else), in ``param_group["lr"]``. Readers of the applied rate
(``optim/lr``, the telemetry's update ratios, a divergence message) take it from the plan too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from fathom.data import DataSplits, random_crop_flip
from fathom.train.plan import EpochPlan
from fathom.train.sgd import ActiveSGD

Tick = Callable[[int, int, int], None]
"""``tick(epoch, steps_done, steps)``, called before each step of an epoch."""


def plan_batches(
    plan: EpochPlan, device: torch.device, tick: Tick | None
) -> Iterator[tuple[int, torch.Tensor]]:
    """``(i, idx_i)`` for each step ``i`` of ``plan``, the example indices on ``device``;
    ``tick(epoch, i, steps)`` (when set) is called before each step."""
    perm = plan.perm.to(device)
    for i in range(plan.steps):
        if tick is not None:
            tick(plan.epoch, i, plan.steps)
        yield i, perm[plan.batch(i)]


def _autocast_for(device: torch.device, precision: str):
    """bfloat16 autocast for ``bf16``; nothing otherwise."""
    if precision == "bf16":
        # cache_enabled=False: required for CUDA-graph capture under autocast
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=False)
    return nullcontext()


class Augmenter:
    """The fitting batches' augmentation, drawn from its own seeded generator (on the device)."""

    def __init__(self, kind: str, seed: int, device: torch.device) -> None:
        self.kind = kind
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "none":
            return x
        return random_crop_flip(x, self.generator)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


def torch_update(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """A torch optimizer's update from the gradients in ``.grad``, at rate ``lr``:
    ``group["lr"] = lr`` (the one input it reads), ``step()``, ``zero_grad(set_to_none=True)``."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def loss_for(cfg) -> Loss:
    """The training loss of a run: token cross-entropy for a model kind whose row says
    ``tokens`` (:mod:`fathom.config.model_kinds`), else the ``[loss]`` table's
    (:meth:`fathom.losses.labels.LabelLoss.torch_value`; the default is exactly
    ``F.cross_entropy(z, y)``)."""
    from fathom.config.model_kinds import model_kind as row_of

    if row_of(cfg.model.kind).tokens:
        from fathom.models.gpt import token_cross_entropy

        return token_cross_entropy
    from fathom.losses.labels import LabelLoss

    return LabelLoss.of(cfg.loss).torch_value


class Clipper:
    """``clip_grad_norm_(params, max_norm)`` per step, with the epoch's pre-clip norms kept on
    the device (sum, max, clipped count; read once, at the epoch boundary)."""

    def __init__(self, model: torch.nn.Module, max_norm: float, device: torch.device) -> None:
        self.params = [p for p in model.parameters()]
        self.max_norm = max_norm
        self.device = device
        self.reset()

    def reset(self) -> None:
        z = torch.zeros((), dtype=torch.float64, device=self.device)
        self.total, self.largest, self.clipped, self.steps = z, z.clone(), z.clone(), 0

    def __call__(self) -> None:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm).double()
        self.total = self.total + norm
        self.largest = torch.maximum(self.largest, norm)
        self.clipped = self.clipped + (norm > self.max_norm).double()
        self.steps += 1

    def epoch_fields(self) -> dict[str, float | None]:
        """``optim/grad_norm_mean``, ``_max`` and ``optim/clipped_frac`` of the epoch's steps
        (:mod:`fathom.telemetry.trainer_fields`); then starts the next epoch's."""
        if self.steps == 0:
            return dict.fromkeys(
                ("optim/grad_norm_mean", "optim/grad_norm_max", "optim/clipped_frac")
            )
        stats = torch.stack([self.total, self.largest, self.clipped]).tolist()  # note: sync point
        fields = {
            "optim/grad_norm_mean": stats[0] / self.steps,
            "optim/grad_norm_max": stats[1],
            "optim/clipped_frac": stats[2] / self.steps,
        }
        self.reset()
        return fields


class StepBody:
    """The cross-entropy step over the fitting split (see the module docstring).

    ``sgd``: the :class:`~fathom.train.sgd.ActiveSGD` standing in for plain SGD (``autograd.grad``
    over the step's active parameters, no ``.grad``), or ``None`` for ``backward`` and the torch
    optimizer. The gates are the caller's: set them before calling.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        splits: DataSplits,
        device: torch.device,
        precision: str = "fp32",
        augmenter: Augmenter | None = None,
        sgd: ActiveSGD | None = None,
        loss: Loss = F.cross_entropy,
        clipper: Clipper | None = None,
    ) -> None:
        self.model, self.optimizer, self.splits = model, optimizer, splits
        self.device, self.precision = device, precision
        self.augmenter, self.sgd = augmenter, sgd
        self.loss, self.clipper = loss, clipper

    def batch(self, idx: torch.Tensor) -> torch.Tensor:
        """The (augmented) fitting inputs of ``idx``."""
        x = self.splits.fit_x.index_select(0, idx)
        return x if self.augmenter is None else self.augmenter(x)

    def __call__(
        self, idx: torch.Tensor, kept: tuple[bool, ...], lr: float | torch.Tensor
    ) -> torch.Tensor:
        """One step on the examples ``idx`` with the gates ``kept`` at rate ``lr``; return the
        batch's mean CE, detached (a device scalar: nothing is read back)."""
        with _autocast_for(self.device, self.precision):
            logits = self.model(self.batch(idx))
        loss = self.loss(logits.float(), self.splits.fit_y.index_select(0, idx))
        if self.sgd is not None:
            self.sgd.step(loss, kept, lr)
        else:
            loss.backward()
            if self.clipper is not None:
                self.clipper()
            torch_update(self.optimizer, float(lr))
        return loss.detach()
