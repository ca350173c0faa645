"""The interleaved-block timing of ``bench_sd_skip.py`` (why it is built this way: its docstring).

A variant's plan is cut into blocks (:func:`blocks_of`); each block is a pair (untimed
warm-up, timed run) (:data:`Block`); :func:`interleaved_rounds` runs block 1 of every variant,
then block 2 of every variant, ..., the variants' order rotating from block to block, and
returns every block's seconds on :data:`CLOCK` (the calling thread's CPU time by default).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

import fathom.depth.residual as residual
from fathom.train.plan import EpochPlan

CLOCK: Callable[[], float] = time.thread_time


def blocks_of(plan: EpochPlan, block: int) -> list[EpochPlan]:
    """``plan`` cut into consecutive sub-plans of ``block`` steps (the same batches, gates, rates)."""
    out = []
    for a in range(0, plan.steps, block):
        b = min(a + block, plan.steps)
        out.append(
            EpochPlan(
                plan.epoch,
                plan.perm[a * plan.batch_size : b * plan.batch_size],
                plan.kept[a:b],
                plan.gain_values[a:b],
                plan.gains[a:b],
                plan.lrs[a:b],
                plan.batch_size,
            )
        )
    return out


@contextmanager
def reference_gain():
    """The kept branch's gain as a Python float, ``bypass(x) + out * g`` (the form before
    the gain tensor, :func:`fathom.depth.residual.gain_tensor` answering the float)."""
    original = residual.gain_tensor
    residual.gain_tensor = lambda gain, out: gain
    try:
        yield
    finally:
        residual.gain_tensor = original


def on_reference(run: Callable[[EpochPlan], object]) -> Callable[[EpochPlan], object]:
    """``run`` with the kept branches' gain out of place (:func:`reference_gain`)."""

    def wrapped(plan: EpochPlan) -> object:
        with reference_gain():
            return run(plan)

    return wrapped


Block = tuple[Callable[[], object], Callable[[], object]]  # (untimed warm-up, timed block)


def timed(block: Block) -> float:
    """CPU seconds of one block, after its untimed warm-up steps (the same variant's model)."""
    block[0]()
    t0 = CLOCK()
    block[1]()
    return CLOCK() - t0


def interleaved_rounds(
    variants: dict[str, list[Block]], rounds: int, turn: int = 0
) -> dict[str, list[list[float]]]:
    """Seconds of each variant's blocks, ``[round][block]``; blocks interleaved, the variants'
    order rotating from block to block (starting at rotation ``turn``)."""
    names = list(variants)
    nblocks = len(variants[names[0]])
    out: dict[str, list[list[float]]] = {k: [] for k in names}
    for _ in range(rounds):
        acc = {name: [0.0] * nblocks for name in names}
        for b in range(nblocks):
            order = names[turn % len(names) :] + names[: turn % len(names)]
            turn += 1
            for name in order:
                acc[name][b] = timed(variants[name][b])
        for name in names:
            out[name].append(acc[name])
    return out


def topology_rounds(
    dense: list[Block], topo: dict[tuple[bool, ...], list[Block]], rounds: int
) -> dict[tuple[bool, ...], tuple[list[float], list[float]]]:
    """Per topology: its blocks' seconds and those of the dense block run just before each."""
    out: dict[tuple[bool, ...], tuple[list[float], list[float]]] = {k: ([], []) for k in topo}
    for r in range(rounds):
        for k, blocks in topo.items():
            j = r % len(blocks)
            out[k][0].append(timed(dense[j]))
            out[k][1].append(timed(blocks[j]))
    return out
