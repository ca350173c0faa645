"""Cost of the per-forward gate decision of ``SkippableResidual``, and of a kept branch.

Usage: ``python bench/bench_depth_decide.py [--repeats 7] [--calls 20000]``. Measured side by
side in one process, interleaved per repeat, medians over repeats:

* ``decide()`` alone: ``p = 0`` (no draw), a gain set from outside (the trainer's plans),
  and the module's own draw (``p = 0.2``: one float64 uniform from its generator, host side);
* one forward of ``SkippableResidual(Linear(w, w))`` at batch 64 with the branch kept:
  outside gain ``1/(1-p)`` vs its own draw forced to keep (``p`` tiny), so the difference
  is the draw alone, next to the matmul it gates (``w`` = 250 and 1000, the Ciresan widths
  × 0.1 and × 0.5 scale).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch
from torch import nn

from fathom.depth import SkippableResidual


def per_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread, "
        f"load average {os.getloadavg()[0]:.2f}, {args.repeats} repeats"
    )
    fixed = SkippableResidual(nn.Identity(), p=0.0)
    outside = SkippableResidual(nn.Identity(), p=0.2, seed=0)
    outside.gain = 1.25
    own = SkippableResidual(nn.Identity(), p=0.2, seed=0)
    cases = {
        "p = 0": fixed.decide,
        "gain set from outside": outside.decide,
        "own draw (p = 0.2)": own.decide,
    }
    times = {k: [] for k in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            times[name].append(per_call(fn, args.calls))
    for name, t in times.items():
        print(f"decide(), {name:24s} {1e6 * np.median(t):7.2f} µs")
    x_calls = max(args.calls // 20, 200)
    for w in (250, 1000):
        torch.manual_seed(0)
        a = SkippableResidual(nn.Linear(w, w), p=1e-12, seed=0)
        a.gain = 1.0 / (1.0 - 1e-12)
        b = SkippableResidual(nn.Linear(w, w), p=1e-12, seed=0)
        x = torch.randn(64, w)
        ta, tb = [], []
        with torch.no_grad():
            for _ in range(args.repeats):
                ta.append(per_call(lambda a=a, x=x: a(x), x_calls))
                tb.append(per_call(lambda b=b, x=x: b(x), x_calls))
        ma, mb = np.median(ta), np.median(tb)
        print(
            f"forward kept, width {w:4d}, batch 64: outside gain {1e6 * ma:7.1f} µs, "
            f"own draw {1e6 * mb:7.1f} µs, ratio {mb / ma:.3f}"
        )


if __name__ == "__main__":
    main()
