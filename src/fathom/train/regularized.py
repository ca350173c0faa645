"""The regularized step: ``L = CE + λ_reg · P`` with the Lyapunov penalty.

Per step (:func:`fathom.dynamics.regularizer.regularized_gradients`): ``p.grad = ∇CE +
∇(λ_reg · P)`` on the network's prepared input (the model's own input preparation first,
:func:`fathom.models.prep.network_and_input`), the two gradients kept apart for their
norms, then the torch optimizer's update at the plan's rate; the batch and the update are the
step body's (:meth:`fathom.train.step.StepBody.batch`, :func:`fathom.train.step.torch_update`).
Tangents for λ̂ come from the stepper's own generator
(stream ``tangents``), saved with the resume state. ``λ_reg = 0`` trains on CE alone through
the same computation, so both arms of a comparison log the same fields.

Epoch fields (means over the epoch's steps, read once at the boundary): ``train/ce`` and
``train/acc`` (per example, training mode), ``train/penalty``, ``train/lyapunov``,
``grad_norm/total``, ``grad_norm/ce``, ``grad_norm/penalty`` (per step; ``None`` when not
in the loss).
"""

from __future__ import annotations

from typing import Any

import torch

from fathom.config import RegularizerConfig
from fathom.data import DataSplits
from fathom.dynamics.regularizer import StepRecord, regularized_gradients
from fathom.models.prep import network_and_input
from fathom.train.plan import EpochPlan
from fathom.train.step import Augmenter, StepBody, Tick, plan_batches, torch_update

_EPOCH_FIELDS: tuple[str, ...] = (
    "train/ce",
    "train/acc",
    "train/penalty",
    "train/lyapunov",
    "grad_norm/total",
    "grad_norm/ce",
    "grad_norm/penalty",
)


class _EpochSums:
    """Per-step scalars summed on the device (float64); read once per epoch."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = 0
        self.examples = 0

    def _add(self, key: str, value: torch.Tensor | None) -> None:
        if value is None:
            return
        v = value.detach().to(self.device, torch.float64)
        self.sums[key] = v if key not in self.sums else self.sums[key] + v

    def add(self, rec: StepRecord, n: int) -> None:
        self._add("train/ce", rec.ce * n)
        self._add("train/acc", rec.correct)
        self._add("grad_norm/total", rec.grad_norm_total)
        self._add("grad_norm/ce", rec.grad_norm_ce)
        self._add("grad_norm/penalty", rec.grad_norm_penalty)
        self._add("train/penalty", rec.penalty)
        self._add("train/lyapunov", rec.lyapunov)
        self.steps += 1
        self.examples += n

    def read(self) -> dict[str, float | None]:
        """Per-example means of CE and accuracy, per-step means of the rest (host reads)."""
        out: dict[str, float | None] = {}
        for key in _EPOCH_FIELDS:
            total = self.sums.get(key)
            per = self.examples if key in ("train/ce", "train/acc") else self.steps
            out[key] = None if total is None or not per else float(total) / per
        return out


class RegularizedStepper:
    """One epoch of regularized steps; ``epoch_fields`` reads the epoch's sums."""

    name = "regularized"
    tick: Tick | None = None

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        splits: DataSplits,
        device: torch.device,
        reg: RegularizerConfig,
        tangent_seed: int,
        augmenter: Augmenter | None = None,
    ) -> None:
        self.model, self.optimizer, self.splits, self.device = model, optimizer, splits, device
        self.reg, self.augmenter = reg, augmenter
        self.body = StepBody(model, optimizer, splits, device, augmenter=augmenter)
        self.tangents = torch.Generator().manual_seed(tangent_seed)
        self.sums = _EpochSums(device)
        self.captured = 0

    def run_epoch(self, plan: EpochPlan) -> torch.Tensor:
        self.sums = _EpochSums(self.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, idx in plan_batches(plan, self.device, self.tick):
            net, inputs = network_and_input(self.model, self.body.batch(idx))
            rec = regularized_gradients(
                net,
                inputs,
                self.splits.fit_y.index_select(0, idx),
                weight=self.reg.weight,
                target=self.reg.target,
                sub_batch=self.reg.sub_batch,
                measure=False,
                generator=self.tangents,
            )
            torch_update(self.optimizer, plan.lrs[i])
            self.sums.add(rec, int(idx.shape[0]))
            loss_sum += rec.ce.double()
        return loss_sum

    def epoch_fields(self) -> dict[str, Any]:
        return self.sums.read()  # note: CPU-GPU sync point (epoch boundary only)

    def state_dict(self) -> dict[str, Any]:
        aug = None if self.augmenter is None else self.augmenter.state_dict()
        return {"tangents": self.tangents.get_state(), "augmenter": aug}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tangents.set_state(state["tangents"])
        if self.augmenter is not None and state.get("augmenter") is not None:
            self.augmenter.load_state_dict(state["augmenter"])
