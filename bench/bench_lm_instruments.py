"""The language model's instruments at ``gpt-quick``'s size: telemetry per family and the
curvature estimator ``auto`` picks, each against one training step.

**Telemetry.** :class:`fathom.Instruments` on a ``gpt`` model of ``gpt-quick``'s shape
(4 blocks, width 128, 4 heads, context 64, vocabulary 256), read with the token
cross-entropy (:func:`fathom.models.gpt.token_loss`), probe of ``--probe`` windows (the
trainer's default ``telemetry.probe_size`` is 128): the warm ``observe()`` of each family
alone and of every family that applies, on the thread CPU clock, median over ``--repeats``.
The unit is one training step (forward, backward of the token cross-entropy at batch 32,
``gpt-quick``'s batch), median over the same repeats.

**Curvature.** :func:`fathom.curvature.language.token_diagonals` with ``estimator="auto"``
under the default budget on ``--curv-probe`` windows: what it chose and why, its CPU time,
and the GGN trace with its standard error.

Random weights and tokens (the costs do not depend on their values). One torch thread.
Prints the machine, load and repeats.

Usage: python bench/bench_lm_instruments.py [--probe 128] [--repeats 3] [--curv-probe 4]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from fathom.curvature.language import token_diagonals
from fathom.models.gpt import GPT, token_cross_entropy, token_loss
from fathom.telemetry.instruments import Instruments

FAMILIES = ("params", "activations", "backprop", "gradients", "moments")


def cpu_median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--curv-probe", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(256, 64, 4, 128, 4)
    x = torch.randint(0, 256, (args.probe, 64))
    y = torch.randint(0, 256, (args.probe, 64))
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; repeats {args.repeats}"
    )

    xb, yb = x[:32], y[:32]

    def step() -> None:
        model.zero_grad(set_to_none=True)
        token_cross_entropy(model(xb), yb).backward()

    step()
    unit = cpu_median(step, args.repeats)
    model.zero_grad(set_to_none=True)
    print(f"training step (batch 32): {unit:.3f} s CPU")
    for fams in [(f,) for f in FAMILIES] + [FAMILIES]:
        ins = Instruments(model, x, y, fams, loss=token_loss())
        ins.observe()  # discovery (cold)
        t = cpu_median(ins.observe, args.repeats)
        print(
            f"observe {'+'.join(fams)} (probe {args.probe}): {t:.2f} s CPU = {t / unit:.1f} steps"
        )
    n = args.curv_probe
    t0 = time.thread_time()
    est = token_diagonals(model, x[:n], y[:n], loss=token_loss(), samples=8, seed=0)
    dt = time.thread_time() - t0
    print(f"curvature on {n} windows: {est.choice}")
    print(
        f"  {dt:.2f} s CPU = {dt / unit:.1f} steps; GGN trace {est.traces['ggn']:.4g} "
        f"(SE {est.trace_standard_errors['ggn']})"
    )
    print(f"load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
