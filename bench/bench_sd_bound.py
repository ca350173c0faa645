"""How much of the expected saving any gain implementation could realize: the gain-free bound.

For each of the 16 branch topologies ``k`` of the four Ciresan branches, single trainer steps
(:class:`fathom.train.steppers.EagerStepper`, the path ``fathom train`` runs on the CPU) of

* ``gain``: the product's step, kept branches at ``1/(1-p)`` (``sd_constant`` as trained);
* ``fold``: the same with the gain folded into the sum, ``torch.add(bypass, out, alpha=g)``
  (one FMA, last bits differ; measured for the record, not in the product);
* ``free``: every kept branch at gain one (``bypass + out``: dense's kernels for a kept branch;
  not a valid recipe, a timing bound: no form of the gain, fused or not, costs less);

each paired with a gain-free all-kept step (``free 1111``) **of the same model** on the same
batch, on the pinned thread's CPU clock, the pair's order alternating and the variants' order
rotating every round. Pairing steps of two model instances is biased at small width (the
``dense`` rows: the same kernels read 1.02-1.09x; switching models costs cache warmth), so the
reference is the SD model itself. Per topology the median of ``T_k / T_ref`` over the rounds,
then, weighted by the topology's probability under the controller's drop probabilities
``f_k = prod_l (p_l if dropped else 1 - p_l)``::

    realized = sum_k f_k (1 - T_k / T_ref),   expected = sum_k f_k (1 - MAC_k / MAC_dense)

(the expected saving of ``bench_sd_skip.py``, over the exact gate distribution rather than one
epoch's draws). ``free``'s realized/expected is the most any gain implementation can reach on
this machine; what it misses is skipping's own efficiency (the un-skippable work a skipped
branch's MAC share does not count: its bypass and relu, the optimizer, the loss, the batch).

Usage: python bench/bench_sd_bound.py [--width-mult 0.1 0.5] [--rounds 200] [--cpu N]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import platform
import statistics
import time

import torch

import bench_sd_skip as sd
import fathom.depth.residual as residual
from fathom.train.allocator import tune_cpu_allocator
from fathom.train.build import build_controller, build_optimizer, init_model
from fathom.train.plan import EpochPlan, plan_epoch
from fathom.train.steppers import EagerStepper
from sd_harness import blocks_of

TOPOLOGIES = list(itertools.product((True, False), repeat=4))
REFERENCE = "free 1111"  # dense's kernels on the SD model itself: no instance effect
STEPS = 64  # distinct planned steps cycled through (their batches and learning rates)


def with_gains(plan: EpochPlan, kept: tuple[bool, ...], gain_one: bool) -> EpochPlan:
    """``plan`` at topology ``kept``: kept gains ``1/(1-p)`` (or one, ``gain_one``), dropped 0."""
    fixed = sd.fixed_plan(plan, kept)
    if gain_one:
        gains = tuple(1.0 if k else 0.0 for k in kept)
        fixed.gain_values = [gains] * fixed.steps
        fixed.gains = torch.tensor([gains] * fixed.steps, dtype=torch.float32)
    return fixed


def fold_residual(x, branch, bypass, gain):
    """``torch.add(bypass(x), branch(x), alpha=gain)``: the kept gain folded into the sum's
    kernel (one FMA: last bits differ from ``bypass + out * g``; its backward still multiplies
    ``grad * gain``). Measured for the record, not in the product."""
    if isinstance(gain, torch.Tensor) or gain == 1.0:
        return SKIPPABLE_RESIDUAL(x, branch, bypass, gain)
    if gain == 0.0:
        return bypass(x)
    return torch.add(bypass(x), branch(x), alpha=gain)


SKIPPABLE_RESIDUAL = residual.skippable_residual


def folded(run):
    """``run`` with :func:`fold_residual` as the modules' residual sum."""

    def wrapped(plan: EpochPlan):
        residual.skippable_residual = fold_residual
        try:
            return run(plan)
        finally:
            residual.skippable_residual = SKIPPABLE_RESIDUAL

    return wrapped


def build(width_mult: float, batch: int = 64, order: str = "skip,dense,dense_b") -> dict:
    """The product's dense, twin (A/A) and ``sd_constant`` steppers on real MNIST, one plan;
    the models built in ``order`` (where each instance's memory lies depends on it)."""
    n = STEPS * batch
    splits = sd.mnist_splits(n, batch)
    cpu = torch.device("cpu")
    dense_cfg = sd.bench_config("residual", width_mult, batch)
    sd_cfg = sd.bench_config("sd_constant", width_mult, batch)
    cfgs = {"skip": sd_cfg, "dense": dense_cfg, "dense_b": dense_cfg}
    models = {name: init_model(cfgs[name]) for name in order.split(",")}
    controller = build_controller(models["skip"], sd_cfg)
    steppers = {
        name: EagerStepper(
            m,
            build_optimizer(m, dense_cfg.optim),
            controller if name == "skip" else None,
            splits,
            cpu,
        ).run_epoch
        for name, m in models.items()
    }
    plan = plan_epoch(1, n, batch, torch.Generator().manual_seed(1), controller, sd_cfg.optim)
    dense_plan = EpochPlan(
        1, plan.perm, [()] * STEPS, [()] * STEPS, torch.ones(STEPS, 0), plan.lrs, batch
    )
    probs = [float(p) for p in controller.schedule.at(0)]
    return {
        "steppers": steppers,
        "plan": plan,
        "dense_plan": dense_plan,
        "model": models["skip"],
        "probs": probs,
    }


def paired_ratios(ref: list, steps: dict[str, list], rounds: int, clock) -> dict[str, list[float]]:
    """``T_variant / T_ref`` of single steps, each variant's step beside a reference step of
    the same planned batch; the pair's order alternates (the second of two steps is not the
    first's equal: caches, the allocator) and the variants' order rotates every round."""
    names = list(steps)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        j = r % len(ref)
        shift = r % len(names)
        for i, name in enumerate(names[shift:] + names[:shift]):
            first, second = (ref[j], steps[name][j]) if (r + i) % 2 else (steps[name][j], ref[j])
            t0 = clock()
            first()
            t1 = clock()
            second()
            t2 = clock()
            t_first, t_second = t1 - t0, t2 - t1
            t_ref, t_var = (t_first, t_second) if first is ref[j] else (t_second, t_first)
            out[name].append(t_var / t_ref)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width-mult", type=float, nargs="+", default=[0.1, 0.5])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--cpu", type=int, default=-1, help="pin to this CPU (-1: the last one)")
    ap.add_argument(
        "--order", default="skip,dense,dense_b", help="the order the three models are built in"
    )
    args = ap.parse_args()
    cpu = args.cpu if args.cpu >= 0 else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    tune_cpu_allocator()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, one thread "
        f"pinned to cpu {cpu}, thread clock, load average {load}; models built in the order "
        f"{args.order}"
    )
    for w in args.width_mult:
        built = build(w, order=args.order)
        plan, sd_model, steppers = built["plan"], built["model"], built["steppers"]
        controller_probs = built["probs"]
        dense_plan = built["dense_plan"]
        variants = {
            "dense": (steppers["dense"], dense_plan),
            "dense_b": (steppers["dense_b"], dense_plan),
        }
        for k in TOPOLOGIES:
            bits = "".join(str(int(b)) for b in k)
            variants[f"gain {bits}"] = (steppers["skip"], with_gains(plan, k, gain_one=False))
            variants[f"free {bits}"] = (steppers["skip"], with_gains(plan, k, gain_one=True))
            variants[f"fold {bits}"] = (
                folded(steppers["skip"]),
                with_gains(plan, k, gain_one=False),
            )
        steps = {
            name: [functools.partial(run, p) for p in blocks_of(pl, 1)]
            for name, (run, pl) in variants.items()
        }
        ref = steps.pop(REFERENCE)
        for s in [*ref, *itertools.chain.from_iterable(steps.values())]:
            s()  # warm: every topology's parameter list, the allocator, the caches
        ratios = paired_ratios(ref, steps, args.rounds, time.thread_time)
        mac_dense = sd.train_macs(sd_model)
        freq = {
            k: math.prod(1 - p if kk else p for kk, p in zip(k, controller_probs, strict=True))
            for k in TOPOLOGIES
        }
        expected = sum(f * (1 - sd.train_macs(sd_model, k) / mac_dense) for k, f in freq.items())
        med = {name: statistics.median(v) for name, v in ratios.items()}
        print(
            f"\nwidth x {w}: widths {sd_model.widths}, batch 64, {args.rounds} rounds of single "
            "steps, each beside a gain-free all-kept step of the same model (load now "
            f"{os.getloadavg()[0]:.2f}); drop probabilities {controller_probs}; expected saving "
            f"{expected:.2%}"
        )
        for name in ("dense", "dense_b", "free 1110"):
            q = statistics.quantiles(ratios[name], n=4)
            print(f"  {name:>9} / free 1111: median {med[name]:.3f} (IQR {q[0]:.3f}..{q[2]:.3f})")
        print("  topology  P(topology)  MAC ratio   gain   fold   free  (T / T of free 1111)")
        for k in TOPOLOGIES:
            bits = "".join(str(int(b)) for b in k)
            mac = sd.train_macs(sd_model, k) / mac_dense
            print(
                f"  {bits:>8}  {freq[k]:11.4f}  {mac:9.3f}  {med['gain ' + bits]:.3f}"
                f"  {med['fold ' + bits]:.3f}  {med.get('free ' + bits, 1.0):.3f}"
            )
        for form in ("gain", "fold", "free"):
            real = sum(
                f * (1 - med.get(f"{form} {''.join(str(int(b)) for b in k)}", 1.0))
                for k, f in freq.items()
            )
            print(
                f"  {form}: realized {real:.2%} of an all-kept gain-free step, realized/expected "
                f"{real / expected:.3f}"
            )


if __name__ == "__main__":
    main()
