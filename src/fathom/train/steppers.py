"""Step execution over epoch plans: the eager path, and the choice among the three paths.

A stepper (:class:`fathom.train.protocols.Stepper`) consumes an
:class:`~fathom.train.plan.EpochPlan` and returns the device sum of the batches' training
losses; the loop does everything else. Three paths satisfy it, two of them over the one step
body :class:`fathom.train.step.StepBody` (gather -> autocast -> CE -> gradients -> update):

* :class:`EagerStepper`: the step body per batch (any device, SGD or AdamW; the reference):
  plain SGD through :class:`fathom.train.sgd.ActiveSGD` (``autograd.grad`` over the step's
  active parameters, torch's foreach kernels, bit-identical), every other optimizer through
  ``loss.backward()``, ``optimizer.step()``, ``zero_grad(None)``;
* :class:`fathom.train.fast.GraphStepper`: the step body captured in CUDA graphs, one per
  branch topology (SGD);
* :class:`fathom.train.regularized.RegularizedStepper`: ``CE + λ_reg · P`` with the
  Lyapunov penalty, the two gradients kept apart for their norms (the step body's batch and
  torch update).

A new path is one module with a class satisfying the Protocol and its branch in
:func:`make_stepper`. Every stepper calls its ``tick`` (when set: :func:`step_ticker`) before
each step with the epoch, the steps done and the epoch's steps — Python ints the loop already
has, so a progress display reads nothing from the device and adds no sync.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

from fathom.base.terminal import OnProgress
from fathom.config.model_kinds import model_kind
from fathom.config.run import LossConfig
from fathom.data import DataSplits
from fathom.errors import FathomError
from fathom.train.build import stream_seed
from fathom.train.fast import GraphStepper
from fathom.train.plan import EpochPlan
from fathom.train.protocols import Stepper
from fathom.train.regularized import RegularizedStepper
from fathom.train.sgd import ActiveSGD, plain_sgd_blocker
from fathom.train.step import Augmenter, Clipper, Loss, StepBody, Tick, loss_for, plan_batches


def step_ticker(progress: OnProgress | None, epochs: int) -> Tick | None:
    """A stepper's ``tick`` sending ``progress("step", {"epoch", "epochs", "step", "steps"})``
    (``step`` = steps done in the epoch); ``None`` without a progress callback."""
    if progress is None:
        return None

    def tick(epoch: int, step: int, steps: int) -> None:
        progress("step", {"epoch": epoch, "epochs": epochs, "step": step, "steps": steps})

    return tick


def run_timed(stepper: Stepper, plan: EpochPlan, clocks) -> torch.Tensor:
    """``stepper.run_epoch(plan)`` with its CPU time added to ``clocks.training_cpu_s``.

    The CPU training clock: ``time.thread_time()`` of the calling (training) thread over
    the epoch's optimizer steps, beside the loop's wall training clock ``training_s``. It
    counts only this thread: with one torch thread (``OMP_NUM_THREADS=1``, a study's
    ``threads = 1``) that is all of a step's CPU work; torch's intra-op worker threads and
    a GPU's own time are not in it. Waiting (another job holding the core) is not counted,
    which is what makes it the clock to compare on a shared machine.
    """
    t0 = time.thread_time()
    loss_sum = stepper.run_epoch(plan)
    clocks.training_cpu_s += time.thread_time() - t0
    return loss_sum


class EagerStepper:
    """The reference path: one :class:`~fathom.train.step.StepBody` per batch, eagerly.

    With ``torch.optim.SGD`` (foreach kernels, the default) the gradients and the update
    go through :class:`fathom.train.sgd.ActiveSGD`: ``torch.autograd.grad`` over the step's
    active parameters and torch's own foreach SGD kernels, bit-identical to
    ``loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)``, which
    every other optimizer runs.
    """

    name = "eager"
    tick: Tick | None = None

    def __init__(
        self,
        model,
        optimizer,
        controller,
        splits: DataSplits,
        device,
        precision: str = "fp32",
        augmenter: Augmenter | None = None,
        loss: Loss = F.cross_entropy,
        clipper: Clipper | None = None,
    ):
        self.model, self.optimizer, self.controller = model, optimizer, controller
        self.splits, self.device, self.precision = splits, device, precision
        self.augmenter = augmenter
        self.captured = 0
        plain = clipper is None and plain_sgd_blocker(optimizer, model) is None
        sgd = ActiveSGD(model, optimizer, controller) if plain else None
        self.body = StepBody(
            model, optimizer, splits, device, precision, augmenter, sgd, loss, clipper
        )

    @property
    def sgd(self) -> ActiveSGD | None:
        """The step body's :class:`~fathom.train.sgd.ActiveSGD`, or ``None`` (torch's own
        ``backward`` / ``step``); setting it switches the body's update."""
        return self.body.sgd

    @sgd.setter
    def sgd(self, sgd: ActiveSGD | None) -> None:
        self.body.sgd = sgd

    def run_epoch(self, plan: EpochPlan) -> torch.Tensor:
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, idx in plan_batches(plan, self.device, self.tick):
            if self.controller is not None:
                self.controller.set_gains(plan.gain_values[i])
            loss_sum += self.body(idx, plan.kept[i], plan.lrs[i])
        if self.controller is not None:
            self.controller.release()
        return loss_sum

    def epoch_fields(self) -> dict[str, Any]:
        clipper = self.body.clipper
        return {} if clipper is None else clipper.epoch_fields()

    def state_dict(self) -> dict[str, Any]:
        return {"augmenter": None if self.augmenter is None else self.augmenter.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.augmenter is not None and state.get("augmenter") is not None:
            self.augmenter.load_state_dict(state["augmenter"])


def _graph_blocker(cfg, k: int) -> str | None:
    """Why the graph path cannot run this config (``None`` when it can)."""
    if cfg.optim.name != "sgd" or cfg.optim.nesterov:
        return f"the graph path implements plain SGD with momentum, not {cfg.optim.name}"
    if cfg.data.augment != "none":
        return "augmented batches run eagerly"
    if cfg.optim.clip_norm is not None:
        return "gradient clipping runs eagerly"
    if model_kind(cfg.model.kind).tokens:
        return "the token cross-entropy step runs eagerly"
    if cfg.loss != LossConfig():
        return f"the graph path implements cross-entropy, not [loss] {cfg.loss.name!r}"
    if k > cfg.execution.max_graph_branches:
        return (
            f"{k} skippable branches give 2**{k} topologies, above the capture limit "
            f"2**{cfg.execution.max_graph_branches} (execution.max_graph_branches)"
        )
    return None


def make_stepper(cfg, model, optimizer, controller, splits, device) -> tuple[Stepper, str | None]:
    """Pick the execution path of ``cfg``; return ``(stepper, note or None)``.

    The augmentation and tangent RNG streams are seeded by
    :func:`fathom.train.build.stream_seed` of ``cfg.seed``.
    """
    augmenter = None
    if cfg.data.augment != "none":
        augmenter = Augmenter(cfg.data.augment, stream_seed(cfg.seed, "augment"), device)
    ex = cfg.execution
    if cfg.regularizer is not None:
        note = None if ex.path != "graph" else "the regularized step runs eagerly"
        stepper = RegularizedStepper(
            model,
            optimizer,
            splits,
            device,
            cfg.regularizer,
            stream_seed(cfg.seed, "tangents"),
            augmenter,
        )
        return stepper, note
    k = controller.num_branches if controller is not None else 0
    if ex.path == "graph" and device.type != "cuda":
        raise FathomError("execution.path = 'graph' needs a CUDA device; use 'auto' or 'eager'")
    path, note = ex.path, None
    if path in ("auto", "graph") and device.type == "cuda":
        blocker = _graph_blocker(cfg, k)
        if blocker is not None:
            path, note = "eager", f"{blocker}: running eagerly"
    if path == "auto":
        path = "graph" if device.type == "cuda" else "eager"
    if path == "graph":
        return GraphStepper(model, optimizer, controller, splits, device, ex.precision), note
    clip = cfg.optim.clip_norm
    clipper = None if clip is None else Clipper(model, clip, device)
    loss = loss_for(cfg)
    stepper = EagerStepper(
        model, optimizer, controller, splits, device, ex.precision, augmenter, loss, clipper
    )
    return stepper, note
