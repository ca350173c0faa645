"""The CUDA-graph step path over precomputed epoch plans (:mod:`fathom.train.plan`).

The step loop never reads a device value back. The graph path captures one CUDA graph per branch topology (``2**k`` for ``k`` skippable
branches, ``k <= max_graph_branches``). Each graph holds the one step body
(:class:`fathom.train.step.StepBody`: gather -> forward -> gradients -> SGD-with-momentum
update) of exactly the topology's *active* parameters, so skipped branches
keep parameters and momentum untouched — the same semantics as the eager path, where a
skipped branch has ``grad is None`` and ``torch.optim.SGD`` skips it.

The graph path's update (:func:`fathom.train.sgd.sgd_momentum_`, through
:class:`~fathom.train.sgd.ActiveSGD`) is torch's foreach SGD written with a device-resident
learning rate (``p -= lr_t * buf``); with a Python-float learning rate it
issues the same kernels as ``torch.optim.SGD(foreach=True)`` and agrees bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from fathom.data import DataSplits
from fathom.depth import GateController
from fathom.train.build import init_momentum_buffers
from fathom.train.plan import EpochPlan, topology_index
from fathom.train.sgd import ActiveSGD
from fathom.train.step import StepBody, Tick


class GraphStepper:
    """One CUDA graph per branch topology; ``emulate=True`` runs the same step body eagerly.

    The emulated mode (any device) exercises everything but the capture itself: static
    buffers, plan consumption, topology indexing, the manual momentum update over active
    parameters. Partial last batches and steps whose active parameters lack a momentum
    buffer (the very first steps) run the step body eagerly.
    """

    name = "graph"
    tick: Tick | None = None

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
        self.sgd = ActiveSGD(model, optimizer, controller, fused=fused)
        self.body = StepBody(model, optimizer, splits, device, precision, sgd=self.sgd)
        if self.fused:
            init_momentum_buffers(optimizer)

    # -- the step body (captured, or run eagerly) -----------------------------------------
    def _set_gates(self, kept: tuple[bool, ...]) -> None:
        if self.controller is None:
            return
        for i, (branch, k) in enumerate(zip(self.controller.branches, kept, strict=True)):
            branch.gain = self.gain[i] if k else 0.0

    def _body(self, idx: torch.Tensor, kept: tuple[bool, ...], lr: float | torch.Tensor) -> None:
        self._set_gates(kept)
        loss = self.body(idx, kept, lr)
        with torch.no_grad():
            self.loss_sum.add_(loss)

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
            if self.tick is not None:
                self.tick(plan.epoch, i, plan.steps)
            kept = plan.kept[i]
            sl = plan.batch(i)
            full = sl.stop <= n
            if self.k:
                self.gain.copy_(gains[i])
            if self.emulate or not full or not self.sgd.ready(kept):
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

    def epoch_fields(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None
