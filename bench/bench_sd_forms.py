"""The kept branch's gain in three bit-identical forms, all-kept step against dense.

Single alternating steps (:func:`bench_sd_ops.step_ab` over ``bench_sd_ops.runners``: the
trainer's own ``EagerStepper`` steps, recipe ``sd_constant`` with every branch kept at gain
``1/(1-p)``, against recipe ``residual``); per pair the ratio of thread-clock times; the
median, interquartile range and the ratio of minima:

* ``product``:   ``bypass(x) + out * g`` with ``g`` a cached 0-d tensor (the product's path)
* ``inplace``:   ``out.mul_(g).add_(bypass(x))`` with the same ``g`` (removed from the
  product as not faster; kept here as the record)
* ``out_float``: ``bypass(x) + out * g`` with the Python float (the form before the gain tensor,
  ``sd_harness.reference_gain``)
* ``gain_one``:  the same all-kept SD step with every kept gain replaced by one (``bypass(x) +
  out``, the dense form): not a training form (the wrong gain), the decomposition. ``product``
  minus ``gain_one`` is what the gain's multiply costs with its autograd node and backward
  multiply; ``gain_one`` minus dense is everything else stochastic depth adds to a step (the
  controller's gains, the decision in ``forward``, the active-parameter list).

Usage: OMP_NUM_THREADS=1 python bench/bench_sd_forms.py [--width-mult 0.1 0.5] [--pairs 600]
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager

import torch

import bench_sd_ops as ops
import fathom.depth.residual as residual
from fathom.depth.residual import gain_tensor
from sd_harness import reference_gain


def in_place(x, branch, bypass, gain):
    """The removed in-place form of :func:`fathom.depth.residual.skippable_residual`."""
    if isinstance(gain, torch.Tensor):
        return bypass(x) + branch(x) * gain
    if gain == 0.0:
        return bypass(x)
    out = branch(x)
    if gain == 1.0:
        return bypass(x) + out
    return out.mul_(gain_tensor(gain, out)).add_(bypass(x))


def gain_one(x, branch, bypass, gain):
    """The product's form with a kept Python-float gain taken as one (decomposition only)."""
    if not isinstance(gain, torch.Tensor) and gain != 0.0:
        gain = 1.0
    return PRODUCT(x, branch, bypass, gain)


PRODUCT = residual.skippable_residual


def form(fn):
    """A context manager running the model's branches through ``fn`` instead of the product."""

    @contextmanager
    def patched():
        residual.skippable_residual = fn
        try:
            yield
        finally:
            residual.skippable_residual = PRODUCT

    return patched


in_place_form, gain_one_form = form(in_place), form(gain_one)


def under(form, steps: list) -> list:
    """Each step run inside ``form()`` (patching a module attribute: well under a microsecond)."""

    def wrap(step):
        def run() -> None:
            with form():
                step()

        return run

    return [wrap(s) for s in steps]


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
        steps, _ = ops.runners(wm, 64)
        kept = steps["1111"]
        forms = {
            "dense": steps["dense"],
            "dense_b": steps["dense_b"],  # A/A: an identical second dense model
            "product": kept,
            "inplace": under(in_place_form, kept),
            "out_float": under(reference_gain, kept),
            "gain_one": under(gain_one_form, kept),
        }
        print(f"width x {wm}: all-kept step per form")
        ops.step_ab(forms, args.pairs)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
