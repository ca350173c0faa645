"""What a stochastic-depth step dispatches beyond the dense step: deterministic counts.

Counts hold under any load (they are not timings): for one trainer step
(:class:`fathom.train.steppers.EagerStepper`, the path ``fathom train`` runs on the CPU) of

* ``dense``: recipe ``residual`` (every branch at gain one, no controller);
* ``1111``: recipe ``sd_constant``, every branch kept at gain ``1/(1-p)`` (the product's path);
* ``1111 main``: the gain as a Python float and gains set through ``nn.Module.__setattr__``
  (:func:`main_form`, the form before the third pass; the same bits);
* ``1111 ref``: the gain as a Python float (``bypass(x) + out * g``:
  ``sd_harness.reference_gain``), gains set as in ``1111``;
* ``1010``, ``0000``: two skipping topologies;

it prints every operator the dispatcher ran (``torch.profiler`` record counts: kernels,
views, and the conversions inside kernels, such as a wrapped Python scalar's ``aten::to``)
where the variants differ, and the Python function calls (``sys.setprofile``: calls into
Python functions and C builtins) per step.

Then the floor that no bit-identical kernel removes: per kept branch, the gain's forward
multiply and its backward (``MulBackward0``), two elementwise passes over ``[batch, d_out]``
that the dense step does not run; timed on the pinned thread's CPU clock, interleaved with
the dense step (minima over rounds: interference only adds time), and compared with the
drawn gates' expected saving in microseconds. Last, each variant's single steps against the
dense step run just before each (``--pairs``; an A/A control ``dense_b`` among them).

Usage: python bench/bench_sd_ops.py [--width-mult 0.1 0.5] [--rounds 30] [--cpu N]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext

import torch
from torch.profiler import ProfilerActivity, profile

import bench_sd_skip as sd
import fathom.depth.control as control
import fathom.depth.residual as residual
from fathom.depth.residual import gain_tensor

STEPS = 4  # steps per counted block
PLAN_STEPS = 100  # the drawn gates of bench_sd_skip.py's plan (its expected saving)
TOPOLOGIES = {"1010": (True, False, True, False), "0000": (False,) * 4}


def runners(width_mult: float, batch: int) -> tuple[dict, dict]:
    """Per variant, its single-step blocks (callables, one per planned step); the build."""
    built = sd.build_variants(width_mult, PLAN_STEPS, batch, 1, 0)
    topo = built["topo"]
    run = {
        "dense": built["variants"]["dense"],
        "dense_b": built["variants"]["dense_b"],
        "1111": topo[(True,) * 4],
        "1111 main": topo[(True,) * 4],  # run under main_form(): the form before this pass
        "1111 ref": built["topo_ref"]["1111 ref"],
    }
    run.update({k: topo[v] for k, v in TOPOLOGIES.items()})
    return {k: [b[1] for b in v] for k, v in run.items()}, built


@contextmanager
def main_form():
    """The kept gain as before the third pass: the Python float, gains set through
    ``nn.Module.__setattr__`` (the same bits: ``tests/test_sd_dispatch.py``)."""
    saved = residual.gain_tensor, control.set_gain
    residual.gain_tensor = lambda gain, out: gain
    control.set_gain = lambda module, gain: setattr(module, "gain", gain)
    try:
        yield
    finally:
        residual.gain_tensor, control.set_gain = saved


def block(steps: list, name: str, n: int = STEPS):
    """The first ``n`` steps of a variant as one callable (``1111 main`` under main_form)."""

    def run() -> None:
        with main_form() if name == "1111 main" else nullcontext():
            for step in steps[:n]:
                step()

    return run


def dispatched(run) -> collections.Counter:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return collections.Counter({e.key: e.count for e in prof.key_averages()})


def python_calls(run) -> int:
    n = 0

    def count(frame, event, arg) -> None:
        nonlocal n
        n += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return n


def count_table(steps: dict) -> None:
    run = {k: block(v, k) for k, v in steps.items() if k not in ("dense_b", "1111 main")}
    for r in run.values():
        r()  # warm: topologies' parameter lists, allocator, caches
    ops = {k: dispatched(r) for k, r in run.items()}
    py = {k: python_calls(r) for k, r in run.items()}
    names = list(run)
    print(f"  {'per step':40}" + "".join(f"{k:>10}" for k in names))
    keys = sorted(set().union(*ops.values()))
    for key in keys:
        row = [ops[k][key] / STEPS for k in names]
        if len(set(row)) > 1:
            print(f"  {key[:40]:40}" + "".join(f"{v:10.2f}" for v in row))
    total = [sum(ops[k].values()) / STEPS for k in names]
    print(f"  {'operator calls, all':40}" + "".join(f"{v:10.2f}" for v in total))
    print(f"  {'Python calls':40}" + "".join(f"{py[k] / STEPS:10.2f}" for k in names))


def floor_us(model, batch: int, rounds: int, dense_run) -> tuple[float, float]:
    """The two irreducible multiplies of the kept branches vs the expected saving, in us."""
    outs = [torch.randn(batch, b.linear.out_features) for b in model.blocks]
    gy = [torch.randn_like(o) for o in outs]
    gains = [gain_tensor(1 / (1 - p), outs[0]) for p in sd.PROBS]

    def extra() -> None:  # forward out.mul_(g) and backward grad * g of all four branches
        for o, g, t in zip(outs, gy, gains, strict=True):
            o.mul_(t)
            torch.mul(g, t)

    reps, t_extra, t_dense = 50, [], []
    for i in range(rounds):
        for name in ("extra", "dense")[i % 2 :] + ("extra", "dense")[: i % 2]:
            t0 = time.thread_time()
            if name == "extra":
                for _ in range(reps):
                    extra()
                t_extra.append((time.thread_time() - t0) / reps)
            else:
                dense_run()
                t_dense.append((time.thread_time() - t0) / STEPS)
    # interference only adds time: the minimum over rounds is the quiet estimate
    e, d = min(t_extra) * 1e6, min(t_dense) * 1e6
    print(
        f"  dense step {d:.1f} us; the kept gain's two multiplies x 4 branches {e:.1f} us "
        f"(minima over {rounds} rounds; medians {statistics.median(t_dense) * 1e6:.1f}, "
        f"{statistics.median(t_extra) * 1e6:.1f} us)"
    )
    print(f"  -> all-kept step >= {1 + e / d:.4f} x dense with bit-identical kernels")
    return e, d


def step_ab(steps: dict, pairs: int) -> None:
    """Single steps of each variant against the dense step just before it, alternating."""
    names = [k for k in steps if k != "dense"]
    ratio: dict[str, list[float]] = {k: [] for k in names}
    low: dict[str, list[float]] = {k: [] for k in ["dense", *names]}
    nsteps = len(steps["dense"])
    for i in range(pairs):
        j = i % nsteps
        for name in names:
            dense = timed_step(steps["dense"][j], "dense")
            t = timed_step(steps[name][j], name)
            ratio[name].append(t / dense)
            low["dense"].append(dense)
            low[name].append(t)
    d = min(low["dense"])
    print(f"  single alternating steps, {pairs} pairs per variant: T/T_dense")
    for name in names:
        r = sorted(ratio[name])
        print(
            f"  {name:>9}  median {statistics.median(r):.4f} (IQR {r[len(r) // 4]:.3f}.."
            f"{r[3 * len(r) // 4]:.3f})  ratio of minima {min(low[name]) / d:.4f}"
        )


def timed_step(step, name: str) -> float:
    with main_form() if name == "1111 main" else nullcontext():
        t0 = time.thread_time()
        step()
        return time.thread_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width-mult", type=float, nargs="+", default=[0.1, 0.5])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--pairs", type=int, default=200, help="alternating single-step pairs")
    ap.add_argument("--cpu", type=int, default=-1, help="pin to this CPU (-1: the last one)")
    args = ap.parse_args()
    cpu = args.cpu if args.cpu >= 0 else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, one thread pinned to cpu {cpu}, load average {load}")
    for w in args.width_mult:
        run, built = runners(w, args.batch)
        plan, model = built["plan"], built["sd_model"]
        dense_macs = sd.train_macs(model)
        expected = 1 - statistics.mean(sd.train_macs(model, k) for k in plan.kept) / dense_macs
        kept_share = statistics.mean(sum(k) for k in plan.kept) / 4
        print(f"\nwidth x {w}: widths {model.widths}, batch {args.batch}")
        count_table(run)
        e, d = floor_us(model, args.batch, args.rounds, block(run["dense"], "dense"))
        cost = kept_share * e  # the drawn steps keep this share of the branches on average
        print(
            f"  drawn gates: expected saving {expected:.2%} = {expected * d:.1f} us/step; "
            f"kept-gain floor {cost:.1f} us/step (kept share {kept_share:.3f}) -> "
            f"realized/expected <= {1 - cost / (expected * d):.3f} with bit-identical kernels"
        )
        if args.pairs:
            step_ab(run, args.pairs)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
