"""Measured inference time of reduced networks and of grouped routed inference.

Each fixed mask runs the model with its removed branches not computed
(:func:`fathom.depth.branch_mask`). Within each repeat every mask is timed once, in a
fresh random order, so drifting machine load spreads over all masks alike; a mask's time is
the median over repeats and its speedup is ``median(dense) / median(mask)``. On CUDA the
clock is read after ``torch.cuda.synchronize``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fathom.depth import branch_mask, dense_eval


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: this is a CPU-GPU sync point (timing only)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


@dataclass(frozen=True)
class MaskTiming:
    """Median seconds per forward of a batch, per mask, with the dense reference."""

    batch_size: int
    repeats: int
    device: str
    threads: int
    seconds: list[float]
    dense_seconds: float

    def speedups(self) -> list[float]:
        return [self.dense_seconds / s for s in self.seconds]

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "repeats": self.repeats,
            "device": self.device,
            "threads": self.threads,
            "median_seconds": self.seconds,
            "dense_median_seconds": self.dense_seconds,
            "speedup_vs_dense": self.speedups(),
        }


@torch.no_grad()
def time_masks(
    model: nn.Module,
    x: torch.Tensor,
    masks: np.ndarray,
    full_index: int,
    repeats: int = 7,
    warmup: int = 1,
    seed: int = 0,
) -> MaskTiming:
    """Median time of one forward of the batch ``x`` under each mask (module docstring)."""
    device = x.device
    rng = np.random.default_rng(seed)
    rows = [tuple(int(b) for b in row) for row in masks]
    times: list[list[float]] = [[] for _ in rows]
    with dense_eval(model):
        for rep in range(warmup + repeats):
            for m in rng.permutation(len(rows)):
                with branch_mask(model, rows[m]):
                    t = _timed(lambda: model(x), device)
                if rep >= warmup:
                    times[m].append(t)
    seconds = [float(np.median(t)) for t in times]
    return MaskTiming(
        batch_size=int(x.shape[0]),
        repeats=repeats,
        device=str(device),
        threads=torch.get_num_threads(),
        seconds=seconds,
        dense_seconds=seconds[full_index],
    )


@torch.no_grad()
def routed_forward(
    model: nn.Module,
    x: torch.Tensor,
    assignment: np.ndarray,
    masks: np.ndarray,
    batch_size: int,
) -> torch.Tensor:
    """Logits of ``x`` with example ``i`` run under mask ``assignment[i]``, grouped by mask."""
    out: torch.Tensor | None = None
    index = torch.as_tensor(assignment, device=x.device)
    with dense_eval(model):
        for m in np.unique(assignment):
            rows = torch.nonzero(index == int(m)).flatten()
            with branch_mask(model, tuple(int(b) for b in masks[m])):
                for s in range(0, rows.numel(), batch_size):
                    part = rows[s : s + batch_size]
                    logits = model(x[part])
                    if out is None:
                        out = logits.new_empty((x.shape[0], logits.shape[1]))
                    out[part] = logits
    assert out is not None
    return out


@torch.no_grad()
def dense_forward(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    with dense_eval(model):
        return torch.cat([model(x[s : s + batch_size]) for s in range(0, x.shape[0], batch_size)])


@dataclass(frozen=True)
class RoutedTiming:
    """Median seconds for the whole split: dense, and routed (features + tree + groups)."""

    examples: int
    batch_size: int
    repeats: int
    device: str
    dense_seconds: float
    routed_seconds: float

    @property
    def slowdown(self) -> float:
        """``routed / dense``: above 1 means routing is slower than the dense network."""
        return self.routed_seconds / self.dense_seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "batch_size": self.batch_size,
            "repeats": self.repeats,
            "device": self.device,
            "dense_median_seconds": self.dense_seconds,
            "routed_median_seconds": self.routed_seconds,
            "routed_over_dense": self.slowdown,
        }


def time_routed(
    model: nn.Module,
    x: torch.Tensor,
    route: Callable[[torch.Tensor], np.ndarray],
    masks: np.ndarray,
    batch_size: int,
    repeats: int = 3,
) -> RoutedTiming:
    """Median over repeats (alternating dense and routed) of whole-split inference time.

    ``route(x)`` must compute the features and return mask indices: it is inside the clock.
    """
    device = x.device
    dense_t, routed_t = [], []
    for rep in range(repeats + 1):
        d = _timed(lambda: dense_forward(model, x, batch_size), device)
        r = _timed(lambda: routed_forward(model, x, route(x), masks, batch_size), device)
        if rep > 0:
            dense_t.append(d)
            routed_t.append(r)
    return RoutedTiming(
        examples=int(x.shape[0]),
        batch_size=batch_size,
        repeats=repeats,
        device=str(device),
        dense_seconds=float(np.median(dense_t)),
        routed_seconds=float(np.median(routed_t)),
    )
