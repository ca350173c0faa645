"""Measured inference time of reduced networks and of grouped routed inference.

Each fixed mask runs the model with its removed branches not computed
(:func:`fathom.depth.branch_mask`). Within each repeat every mask is timed once, in a
fresh random order, so drifting machine load spreads over all masks alike. A mask's time is
the median over repeats with the interquartile range of the repeats as its spread; its
speed-up in repeat ``r`` is ``dense_r / mask_r`` (both timed in that repeat), reported as the
median and IQR of those ratios, with a verdict only when the IQR excludes 1
(:func:`fathom.stats.sentences_repro.speedup_claim`). Routed inference is reported the same
way (``routed_r / dense_r``). On CUDA the clock is read after ``torch.cuda.synchronize``.
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
from fathom.stats.sentences_repro import iqr, speedup_claim


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
    """Seconds per forward of a batch, per mask and repeat (``per_repeat[m][r]``), with the
    dense mask's index; medians, IQRs and per-repeat speed-ups are derived from them."""

    batch_size: int
    repeats: int
    device: str
    threads: int
    per_repeat: list[list[float]]
    dense_index: int

    @property
    def seconds(self) -> list[float]:
        """Median seconds per mask over repeats."""
        return [iqr(t)[0] for t in self.per_repeat]

    @property
    def dense_seconds(self) -> float:
        return self.seconds[self.dense_index]

    def ratios(self, m: int) -> list[float]:
        """Per-repeat speed-ups ``dense_r / mask_r`` of mask ``m``."""
        dense = self.per_repeat[self.dense_index]
        return [d / t for d, t in zip(dense, self.per_repeat[m], strict=True)]

    def speedups(self) -> list[float]:
        """Median per-repeat speed-up of each mask (1 for the dense mask)."""
        return [iqr(self.ratios(m))[0] for m in range(len(self.per_repeat))]

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "repeats": self.repeats,
            "device": self.device,
            "threads": self.threads,
            "spread": "interquartile range over repeats",
            "median_seconds": self.seconds,
            "seconds_iqr": [list(iqr(t)[1:]) for t in self.per_repeat],
            "per_repeat_seconds": self.per_repeat,
            "dense_median_seconds": self.dense_seconds,
            "speedup_vs_dense": self.speedups(),
            "speedup": [speedup_claim(self.ratios(m)) for m in range(len(self.per_repeat))],
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
    return MaskTiming(
        batch_size=int(x.shape[0]),
        repeats=repeats,
        device=str(device),
        threads=torch.get_num_threads(),
        per_repeat=times,
        dense_index=full_index,
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
def _dense_forward(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    with dense_eval(model):
        return torch.cat([model(x[s : s + batch_size]) for s in range(0, x.shape[0], batch_size)])


@dataclass(frozen=True)
class RoutedTiming:
    """Seconds per repeat for the whole split: dense, and routed (features + tree + groups)."""

    examples: int
    batch_size: int
    repeats: int
    device: str
    dense_per_repeat: list[float]
    routed_per_repeat: list[float]

    @property
    def dense_seconds(self) -> float:
        return iqr(self.dense_per_repeat)[0]

    @property
    def routed_seconds(self) -> float:
        return iqr(self.routed_per_repeat)[0]

    def ratios(self) -> list[float]:
        """Per-repeat ``routed_r / dense_r`` (alternately timed in the same repeat)."""
        return [r / d for r, d in zip(self.routed_per_repeat, self.dense_per_repeat, strict=True)]

    @property
    def slowdown(self) -> float:
        """Median of ``routed_r / dense_r``: above 1 means routing takes more time than dense."""
        return iqr(self.ratios())[0]

    def to_dict(self) -> dict[str, Any]:
        _, q1, q3 = iqr(self.ratios())
        return {
            "examples": self.examples,
            "batch_size": self.batch_size,
            "repeats": self.repeats,
            "device": self.device,
            "spread": "interquartile range over repeats",
            "dense_median_seconds": self.dense_seconds,
            "routed_median_seconds": self.routed_seconds,
            "dense_per_repeat_seconds": self.dense_per_repeat,
            "routed_per_repeat_seconds": self.routed_per_repeat,
            "routed_over_dense": self.slowdown,
            "routed_over_dense_iqr": [q1, q3],
            "dense_over_routed": speedup_claim([1 / r for r in self.ratios()]),
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
        d = _timed(lambda: _dense_forward(model, x, batch_size), device)
        r = _timed(lambda: routed_forward(model, x, route(x), masks, batch_size), device)
        if rep > 0:
            dense_t.append(d)
            routed_t.append(r)
    return RoutedTiming(
        examples=int(x.shape[0]),
        batch_size=batch_size,
        repeats=repeats,
        device=str(device),
        dense_per_repeat=dense_t,
        routed_per_repeat=routed_t,
    )
