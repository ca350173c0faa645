"""The kept branch's gain in three bit-identical forms, all-kept step against dense.

Single alternating steps (``bench_sd_ops.runners``: the trainer's own ``EagerStepper`` steps,
recipe ``sd_constant`` with every branch kept at gain ``1/(1-p)``, against recipe
``residual``), each form patched in as ``fathom.depth.residual.skippable_residual``; per pair
the ratio of thread-clock times; the median, interquartile range and the ratio of minima:

* ``product``:   ``bypass(x) + out * g`` with ``g`` a cached 0-d tensor (the product's path)
* ``inplace``:   ``out.mul_(g).add_(bypass(x))`` with the same ``g`` (removed from the
  product as not faster; kept here as the record)
* ``out_float``: ``bypass(x) + out * g`` with the Python float (the form before issue 23)

Usage: OMP_NUM_THREADS=1 python bench/bench_sd_forms.py [--width-mult 0.1 0.5] [--pairs 600]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import bench_sd_ops as ops
import fathom.depth.residual as residual
from fathom.depth.residual import gain_tensor

PRODUCT = residual.skippable_residual


def _kept(gain_form):
    def form(x, branch, bypass, gain):
        if isinstance(gain, torch.Tensor):
            return bypass(x) + branch(x) * gain
        if gain == 0.0:
            return bypass(x)
        out = branch(x)
        if gain == 1.0:
            return bypass(x) + out
        return gain_form(x, out, bypass, gain)

    return form


FORMS = {
    "product": PRODUCT,
    "inplace": _kept(lambda x, out, bypass, g: out.mul_(gain_tensor(g, out)).add_(bypass(x))),
    "out_float": _kept(lambda x, out, bypass, g: bypass(x) + out * g),
}


def pairs_ab(width_mult: float, pairs: int) -> None:
    steps, _ = ops.runners(width_mult, 64)
    kept, dense = steps["1111"], steps["dense"]
    ratios: dict[str, list[float]] = {k: [] for k in FORMS}
    low: dict[str, list[float]] = {k: [] for k in ["dense", *FORMS]}
    try:
        for i in range(pairs):
            j = i % len(kept)
            for name, form in FORMS.items():
                residual.skippable_residual = form
                t0 = time.thread_time()
                dense[j]()
                d = time.thread_time() - t0
                t0 = time.thread_time()
                kept[j]()
                t = time.thread_time() - t0
                ratios[name].append(t / d)
                low["dense"].append(d)
                low[name].append(t)
    finally:
        residual.skippable_residual = PRODUCT
    print(f"width x {width_mult}: {pairs} pairs per form, all-kept T/T_dense")
    for name in FORMS:
        r = sorted(ratios[name])
        print(
            f"  {name:>9}  median {statistics.median(r):.4f} (IQR {r[len(r) // 4]:.3f}.."
            f"{r[3 * len(r) // 4]:.3f})  ratio of minima {min(low[name]) / min(low['dense']):.4f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width-mult", type=float, nargs="+", default=[0.1, 0.5])
    ap.add_argument("--pairs", type=int, default=600)
    ap.add_argument("--cpu", type=int, default=-1, help="pin to this CPU (-1: the last one)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cpu = args.cpu if args.cpu >= 0 else os.cpu_count() - 1
    os.sched_setaffinity(0, {cpu})
    print(f"pinned to cpu {cpu}, threads 1, load average {os.getloadavg()[0]:.2f}")
    for wm in args.width_mult:
        pairs_ab(wm, args.pairs)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
