"""Step execution over precomputed epoch plans: the eager path and the CUDA-graph path.

Everything random about an epoch (the shuffle permutation, every branch gate, the per-step
learning rate) is drawn ahead, on the CPU, from the run's seeded generators, in exactly the
order the eager loop would draw it. The step loop then never reads a device value back.

The graph path captures one CUDA graph per branch topology (``2**k`` for ``k`` skippable
branches, ``k <= max_graph_branches``). Each graph holds gather -> forward -> backward ->
SGD-with-momentum update of exactly the topology's *active* parameters, so skipped branches
keep parameters and momentum untouched — the same semantics as the eager path, where a
skipped branch has ``grad is None`` and ``torch.optim.SGD`` skips it.

The graph path's update (:func:`sgd_momentum_`) is torch's foreach SGD written with a
device-resident learning rate (``p -= lr_t * buf``); with a Python-float learning rate it
issues the same kernels as ``torch.optim.SGD(foreach=True)`` and agrees bit for bit.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fathom.data import DataSplits
from fathom.depth import GateController


def lr_multiplier(schedule: Sequence[Sequence[float]] | None, epoch_progress: float) -> float:
    """Piecewise-linear multiplier at fractional epoch ``epoch_progress`` (constant outside)."""
    if not schedule:
        return 1.0
    xs = [float(e) for e, _ in schedule]
    ys = [float(m) for _, m in schedule]
    if epoch_progress <= xs[0]:
        return ys[0]
    if epoch_progress >= xs[-1]:
        return ys[-1]
    j = bisect.bisect_right(xs, epoch_progress)
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return y0 + (y1 - y0) * (epoch_progress - x0) / (x1 - x0)


def topology_index(kept: Sequence[bool]) -> int:
    """``sum_l kept_l * 2**l``: branch ``l`` kept <=> bit ``l`` set."""
    return sum(1 << i for i, k in enumerate(kept) if k)


def topology_mask(index: int, k: int) -> tuple[bool, ...]:
    return tuple(bool(index >> i & 1) for i in range(k))


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
    base_lr: float,
    lr_schedule: Sequence[Sequence[float]] | None = None,
) -> EpochPlan:
    """Draw epoch ``epoch`` (1-based): the permutation first, then every step's gates."""
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
    lrs = [base_lr * lr_multiplier(lr_schedule, epoch - 1 + i / steps) for i in range(steps)]
    return EpochPlan(epoch, perm, kept, values, gains, lrs, batch_size)


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


def _autocast(device: torch.device, precision: str):
    if precision == "bf16":
        # cache_enabled=False: required for CUDA-graph capture under autocast
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=False)
    return nullcontext()


class EagerStepper:
    """The reference path: ``loss.backward()``, ``torch.optim.SGD.step()``, ``zero_grad(None)``."""

    name = "eager"

    def __init__(
        self, model, optimizer, controller, splits: DataSplits, device, precision: str = "fp32"
    ):
        self.model, self.optimizer, self.controller = model, optimizer, controller
        self.splits, self.device, self.precision = splits, device, precision
        self.captured = 0

    def run_epoch(self, plan: EpochPlan) -> torch.Tensor:
        model, opt, splits = self.model, self.optimizer, self.splits
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        perm = plan.perm.to(self.device)
        for i in range(plan.steps):
            idx = perm[plan.batch(i)]
            if self.controller is not None:
                self.controller.set_gains(plan.gain_values[i])
            for group in opt.param_groups:
                group["lr"] = plan.lrs[i]
            with _autocast(self.device, self.precision):
                logits = model(splits.fit_x[idx])
            loss = F.cross_entropy(logits.float(), splits.fit_y[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_sum += loss.detach()
        if self.controller is not None:
            self.controller.release()
        return loss_sum


class GraphStepper:
    """One CUDA graph per branch topology; ``emulate=True`` runs the same step body eagerly.

    The emulated mode (any device) exercises everything but the capture itself: static
    buffers, plan consumption, topology indexing, the manual momentum update over active
    parameters. Partial last batches and steps whose active parameters lack a momentum
    buffer (the very first steps) run the step body eagerly.
    """

    name = "graph"

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.SGD,
        controller: GateController | None,
        splits: DataSplits,
        device: torch.device,
        precision: str = "tf32",
        emulate: bool = False,
        fused: bool | None = None,
    ) -> None:
        self.model, self.optimizer, self.controller = model, optimizer, controller
        self.splits, self.device, self.precision = splits, device, precision
        self.emulate = emulate or device.type != "cuda"
        group = optimizer.param_groups[0]
        self.momentum, self.weight_decay = float(group["momentum"]), float(group["weight_decay"])
        self.k = controller.num_branches if controller is not None else 0
        self.idx: torch.Tensor | None = None
        self.gain = torch.ones(self.k, dtype=torch.float32, device=device)
        self.lr = torch.zeros((), dtype=torch.float32, device=device)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.captured = 0
        # one fused update kernel on CUDA; the foreach path (bit-identical to
        # torch.optim.SGD(foreach=True)) elsewhere unless asked
        if fused is None:
            fused = device.type == "cuda" or bool(optimizer.param_groups[0].get("fused"))
        self.fused = fused
        self._active: dict[tuple[bool, ...], list[nn.Parameter]] = {}
        self._ready_topologies: set[tuple[bool, ...]] = set()
        if self.fused:
            from fathom.train.build import init_momentum_buffers

            init_momentum_buffers(optimizer)

    # -- the step body (captured, or run eagerly) -----------------------------------------
    def _set_gates(self, kept: tuple[bool, ...]) -> None:
        if self.controller is None:
            return
        for i, (branch, k) in enumerate(zip(self.controller.branches, kept, strict=True)):
            branch.gain = self.gain[i] if k else 0.0

    def _body(self, idx: torch.Tensor, kept: tuple[bool, ...], lr: float | torch.Tensor) -> None:
        self._set_gates(kept)
        params = self._params(kept)
        with _autocast(self.device, self.precision):
            logits = self.model(self.splits.fit_x.index_select(0, idx))
        loss = F.cross_entropy(logits.float(), self.splits.fit_y.index_select(0, idx))
        grads = list(torch.autograd.grad(loss, params))
        state = self.optimizer.state
        bufs = [state[p].get("momentum_buffer") for p in params]
        with torch.no_grad():
            if not self.momentum:
                sgd_momentum_(params, grads, [], lr, 0.0, self.weight_decay, self.fused)
            elif any(b is None for b in bufs):
                self._bootstrap(params, grads, bufs, lr)
            else:
                sgd_momentum_(params, grads, bufs, lr, self.momentum, self.weight_decay, self.fused)
            self.loss_sum.add_(loss.detach())

    @torch.no_grad()
    def _bootstrap(self, params, grads, bufs, lr) -> None:
        """torch's first-step rule for parameters without a buffer: ``b = d`` (a copy)."""
        if self.weight_decay:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        for p, d, b in zip(params, grads, bufs, strict=True):
            if b is None:
                self.optimizer.state[p]["momentum_buffer"] = torch.clone(d).detach()
            else:
                b.mul_(self.momentum).add_(d)
        new = [self.optimizer.state[p]["momentum_buffer"] for p in params]
        if isinstance(lr, torch.Tensor):
            torch._foreach_sub_(params, torch._foreach_mul(new, lr))
        else:
            torch._foreach_add_(params, new, alpha=-lr)

    def _params(self, kept: tuple[bool, ...]) -> list[nn.Parameter]:
        params = self._active.get(kept)
        if params is None:
            params = self._active[kept] = active_parameters(self.model, self.controller, kept)
        return params

    def _ready(self, kept: tuple[bool, ...]) -> bool:
        """Every active parameter has a momentum buffer (then it keeps it for good)."""
        if not self.momentum or kept in self._ready_topologies:
            return True
        state = self.optimizer.state
        if all(state[p].get("momentum_buffer") is not None for p in self._params(kept)):
            self._ready_topologies.add(kept)
            return True
        return False

    # -- capture ------------------------------------------------------------------------------
    def _capture(self, topo: int, kept: tuple[bool, ...]) -> torch.cuda.CUDAGraph:
        """Warm up on a side stream (state restored afterwards), then capture the step."""
        params = list(self.model.parameters())
        bufs = [
            self.optimizer.state[p]["momentum_buffer"]
            for p in params
            if "momentum_buffer" in self.optimizer.state[p]
        ]
        saved_p = [p.detach().clone() for p in params]
        saved_b = [b.clone() for b in bufs]
        saved_loss = self.loss_sum.clone()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._body(self.idx, kept, self.lr)
        torch.cuda.current_stream(self.device).wait_stream(side)
        with torch.no_grad():
            for p, s in zip(params, saved_p, strict=True):
                p.copy_(s)
            for b, s in zip(bufs, saved_b, strict=True):
                b.copy_(s)
            self.loss_sum.copy_(saved_loss)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body(self.idx, kept, self.lr)
        self.captured += 1
        return graph

    # -- an epoch -----------------------------------------------------------------------------
    def run_epoch(self, plan: EpochPlan) -> torch.Tensor:
        if self.idx is None or self.idx.shape[0] != plan.batch_size:
            self.idx = torch.zeros(plan.batch_size, dtype=torch.int64, device=self.device)
            self.graphs.clear()
        perm = plan.perm.to(self.device)
        gains = plan.gains.to(self.device)
        lrs = torch.tensor(plan.lrs, dtype=torch.float32, device=self.device)
        self.loss_sum.zero_()
        n = perm.shape[0]
        for i in range(plan.steps):
            kept = plan.kept[i]
            sl = plan.batch(i)
            full = sl.stop <= n
            if self.k:
                self.gain.copy_(gains[i])
            if self.emulate or not full or not self._ready(kept):
                # eager body: same ops; a Python-float lr keeps the bootstrap exact
                self._body(perm[sl], kept, plan.lrs[i] if self.emulate else lrs[i])
                continue
            topo = topology_index(kept)
            graph = self.graphs.get(topo)
            self.idx.copy_(perm[sl])
            self.lr.copy_(lrs[i])
            if graph is None:
                graph = self.graphs[topo] = self._capture(topo, kept)
            graph.replay()
        if self.controller is not None:
            self.controller.release()
        return self.loss_sum.clone()


def make_stepper(
    cfg, model, optimizer, controller, splits, device
) -> tuple[EagerStepper | GraphStepper, str | None]:
    """Pick the execution path of ``cfg.execution``; return the stepper and a note (or None)."""
    from fathom.errors import FathomError

    ex = cfg.execution
    k = controller.num_branches if controller is not None else 0
    path, note = ex.path, None
    if path == "graph" and device.type != "cuda":
        raise FathomError("execution.path = 'graph' needs a CUDA device; use 'auto' or 'eager'")
    if path in ("auto", "graph") and device.type == "cuda" and k > ex.max_graph_branches:
        note = (
            f"{k} skippable branches give 2**{k} topologies, above the capture limit "
            f"2**{ex.max_graph_branches} (execution.max_graph_branches): running eagerly"
        )
        path = "eager"
    if path == "auto":
        path = "graph" if device.type == "cuda" else "eager"
    if path == "graph":
        return GraphStepper(model, optimizer, controller, splits, device, ex.precision), note
    return EagerStepper(model, optimizer, controller, splits, device, ex.precision), note
