"""What one kept branch's survival gain costs: one Ciresan block, forward + backward.

``relu(crop(h) + g * linear(h))`` at batch 64 for one block of the quick study's widths
(× 0.1: 250 → 200; × 0.5: 1250 → 1000), ``d/d(h, W, b)`` by ``torch.autograd.grad``, on the
pinned thread's CPU clock, the variants interleaved (their order rotating every round), each
round's time divided by the dense block's of the same round; the median over rounds and its
interquartile range are printed:

* ``dense``:    gain one (``skippable_residual(h, linear, crop, 1.0)``, the ``residual`` recipe)
* ``ref``:      gain ``g`` as a Python float, out of place: ``crop(h) + linear(h) * g``
  (before the gain tensor)
* ``product``:  the product's path now: the same with ``g`` a cached 0-d tensor
  (:func:`fathom.depth.residual.gain_tensor`; bit-identical, no wrapped-scalar conversions)
* ``inplace_f``: gain ``g`` in place as a Python float, ``linear(h).mul_(g).add_(crop(h))``
  (bit-identical; the product's path while the gain tensor was built, removed as slower per step)
* ``inplace``:  the same in place with the cached 0-d tensor (bit-identical; removed too)
* ``addalpha``: ``torch.add(crop(h), linear(h), alpha=g)``: one fused kernel (changes last bits;
  not in the product, measured for the record)

Usage: python bench/bench_sd_gain.py [--width-mult 0.1 0.5] [--rounds 100] [--cpu N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from fathom.depth import Crop, skippable_residual
from fathom.depth.residual import gain_tensor
from sd_harness import reference_gain

GAIN = 1 / (1 - 0.3)


def variants(d_in: int, d_out: int) -> tuple[dict, tuple]:
    torch.manual_seed(0)
    h = torch.randn(64, d_in, requires_grad=True)
    lin, crop = nn.Linear(d_in, d_out), Crop(d_out)
    g32 = gain_tensor(GAIN, h)

    def ref() -> torch.Tensor:
        with reference_gain():
            return F.relu(skippable_residual(h, lin, crop, GAIN))

    out = {
        "dense": lambda: F.relu(skippable_residual(h, lin, crop, 1.0)),
        "ref": ref,
        "product": lambda: F.relu(skippable_residual(h, lin, crop, GAIN)),
        "inplace_f": lambda: F.relu(lin(h).mul_(GAIN).add_(crop(h))),
        "inplace": lambda: F.relu(lin(h).mul_(g32).add_(crop(h))),
        "addalpha": lambda: F.relu(torch.add(crop(h), lin(h), alpha=GAIN)),
    }
    return out, (h, lin.weight, lin.bias)


def bench(width_mult: float, rounds: int) -> None:
    d_in, d_out = (250, 200) if width_mult == 0.1 else (1250, 1000)
    fns, wrt = variants(d_in, d_out)
    gy = torch.randn(64, d_out)
    reps = max(1, round(20 * (250 * 200) / (d_in * d_out)))
    names, times = list(fns), {k: [] for k in fns}
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            torch.autograd.grad(fns[name](), wrt, gy)  # untimed: the same variant warm
            t0 = time.thread_time()
            for _ in range(reps):
                torch.autograd.grad(fns[name](), wrt, gy)
            times[name].append((time.thread_time() - t0) / reps)
    print(f"width x {width_mult} ([64, {d_in}] -> {d_out}), {rounds} rounds x {reps} repeats")
    for name in names:
        r = sorted(t / d for t, d in zip(times[name], times["dense"], strict=True))
        print(
            f"  {name:>8}  {statistics.median(times[name]) * 1e6:8.1f} us  /dense "
            f"{statistics.median(r):.3f} (IQR {r[len(r) // 4]:.3f}..{r[3 * len(r) // 4]:.3f})"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width-mult", type=float, nargs="+", default=[0.1, 0.5])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--cpu", type=int, default=-1, help="pin to this CPU (-1: the last one)")
    args = ap.parse_args()
    cpu = args.cpu if args.cpu >= 0 else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, one thread pinned to cpu {cpu}, load average {load}")
    for w in args.width_mult:
        bench(w, args.rounds)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
