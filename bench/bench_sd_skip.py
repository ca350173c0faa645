"""Does stochastic depth save the work it skips?  Timed through the trainer's own step path.

Every variant runs :class:`fathom.train.steppers.EagerStepper.run_epoch` — the code `fathom train`
runs on the CPU — over an :class:`~fathom.train.plan.EpochPlan` of the same batches:

* ``dense``:  recipe ``residual`` (no controller; every branch computed at gain one)
* ``skip``:   recipe ``sd_constant`` with the gates the run's controller draws (p = 0.1..0.4);
              a dropped branch is not called
* ``mask``:   the same model and gates, but every branch computed and multiplied by its gain
              (timm/torchvision-style DropPath: regularises, saves nothing)
* ``plain``:  the same network written as a user would, an ordinary ``nn.Module`` with
              ``torch.optim.SGD`` in a plain loop (float inputs, defaults), no Fathom code

Expected saving = E[sum_l (1 - kept_l) * 3 * in_l * out_l] / train_macs(dense), over the gates
actually drawn, where an affine layer costs 3 * in * out multiply-accumulates per example in
training (forward, input gradient, weight gradient) and the stem 2 * (no input gradient).
Realized saving = 1 - T_skip / T_dense. T is the median over interleaved repeats of one
plan's seconds per step. The per-topology table times plans whose every step has one
topology (gain 1/(1-p) for kept branches), against dense.

Usage: python bench/bench_sd_skip.py [--width-mult 0.5 0.1] [--steps 100] [--repeats 9]
                                    [--threads 1] [--clock thread|wall]
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from fathom.config import RunConfig
from fathom.data import DataSplits
from fathom.depth import find_branches
from fathom.models.ciresan import CiresanMLP
from fathom.train.allocator import tune_cpu_allocator
from fathom.train.build import build_controller, build_optimizer, init_model
from fathom.train.plan import EpochPlan, plan_epoch
from fathom.train.steppers import EagerStepper

PROBS = (0.1, 0.2, 0.3, 0.4)


def train_macs(model: CiresanMLP, kept: tuple[bool, ...] | None = None) -> int:
    """Training multiply-accumulates per example: 2*in*out for the stem, 3*in*out otherwise."""
    layers = model.affine_layers()
    kept = kept if kept is not None else (True,) * (len(layers) - 2)
    total = 2 * layers[0].in_features * layers[0].out_features
    total += 3 * layers[-1].in_features * layers[-1].out_features
    for lin, k in zip(layers[1:-1], kept, strict=True):
        total += 3 * lin.in_features * lin.out_features * int(k)
    return total


class PlainBlock(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.linear, self.d_out = nn.Linear(d_in, d_out), d_out

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.relu(h[:, : self.d_out] + self.linear(h))


class PlainResidualMLP(nn.Module):
    """The dense Ciresan residual MLP as a user would write it (no Fathom code)."""

    def __init__(self, widths: tuple[int, ...], classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Linear(784, widths[0])
        self.blocks = nn.Sequential(*(PlainBlock(a, b) for a, b in itertools.pairwise(widths)))
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(F.relu(self.stem(x))))


def plain_epoch(model, opt, x, y, perm, batch) -> None:
    for i in range(0, perm.shape[0] - batch + 1, batch):
        idx = perm[i : i + batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def fixed_plan(plan: EpochPlan, kept: tuple[bool, ...]) -> EpochPlan:
    """``plan`` with every step at topology ``kept`` (gain 1/(1-p) for kept branches)."""
    gains = tuple(1.0 / (1.0 - p) if k else 0.0 for k, p in zip(kept, PROBS, strict=True))
    steps = plan.steps
    return EpochPlan(
        plan.epoch,
        plan.perm,
        [kept] * steps,
        [gains] * steps,
        torch.tensor([gains] * steps, dtype=torch.float32),
        plan.lrs,
        plan.batch_size,
    )


def mask_mode(model: nn.Module, on: bool) -> None:
    """Compute-then-mask: every branch called, then multiplied by its gain (0 when dropped)."""
    for b in find_branches(model):
        if on:
            b.forward = lambda x, b=b: b.bypass(x) + b.branch(x) * b.gain
        else:
            b.__dict__.pop("forward", None)


CLOCK = time.perf_counter


def time_call(fn, steps: int) -> float:
    t0 = CLOCK()
    fn()
    return (CLOCK() - t0) / steps


def bench_width(width_mult: float, steps: int, repeats: int, batch: int) -> None:
    n = steps * batch
    g = torch.Generator().manual_seed(0)
    x8 = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    splits = DataSplits(x8, y, x8[:batch], y[:batch], x8[:batch], y[:batch], split_hash="bench")

    def cfg(recipe: str) -> RunConfig:
        return RunConfig(name="bench", study="bench").with_updates(
            {
                "model.recipe": recipe,
                "model.width_mult": width_mult,
                "optim.lr": 0.01,
                "optim.batch_size": batch,
                "optim.epochs": 1,
                "device": "cpu",
            }
        )

    dense_cfg, sd_cfg = cfg("residual"), cfg("sd_constant")
    dense_model, sd_model = init_model(dense_cfg), init_model(sd_cfg)
    dense_opt = build_optimizer(dense_model, dense_cfg.optim)
    sd_opt = build_optimizer(sd_model, sd_cfg.optim)
    controller = build_controller(sd_model, sd_cfg)
    dense_step = EagerStepper(dense_model, dense_opt, None, splits, torch.device("cpu"))
    sd_step = EagerStepper(sd_model, sd_opt, controller, splits, torch.device("cpu"))
    shuffle = torch.Generator().manual_seed(1)
    sd_plan = plan_epoch(1, n, batch, shuffle, controller, sd_cfg.optim)
    dense_plan = EpochPlan(
        1, sd_plan.perm, [()] * steps, [()] * steps, torch.ones(steps, 0), sd_plan.lrs, batch
    )

    plain = PlainResidualMLP(dense_model.widths)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9)
    xf = x8.reshape(n, -1).float() / 255

    def run_mask() -> None:
        mask_mode(sd_model, True)
        try:
            sd_step.run_epoch(sd_plan)
        finally:
            mask_mode(sd_model, False)

    variants = {
        "dense": (lambda: dense_step.run_epoch(dense_plan)),
        "skip": (lambda: sd_step.run_epoch(sd_plan)),
        "mask": run_mask,
        "plain": (lambda: plain_epoch(plain, plain_opt, xf, y, sd_plan.perm, batch)),
    }
    topologies = sorted(set(sd_plan.kept), key=lambda k: -sd_plan.kept.count(k))
    for kept in itertools.product((True, False), repeat=len(PROBS)):
        if kept not in topologies:
            topologies.append(kept)
    topo_plans = {k: fixed_plan(sd_plan, k) for k in topologies}
    for fn in variants.values():  # warm-up (allocator, momentum buffers)
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    topo_ratio: dict[tuple[bool, ...], list[float]] = {k: [] for k in topologies}
    for _ in range(repeats):
        for name, fn in variants.items():
            times[name].append(time_call(fn, steps))
        for k, plan in topo_plans.items():  # against this repeat's dense time
            t = time_call(lambda plan=plan: sd_step.run_epoch(plan), steps)
            topo_ratio[k].append(t / times["dense"][-1])
    med = {k: statistics.median(v) for k, v in times.items()}
    dense_macs = train_macs(dense_model)
    expected = 1 - statistics.mean(train_macs(sd_model, k) for k in sd_plan.kept) / dense_macs
    print(
        f"\nwidth x {width_mult}: widths {dense_model.widths}, batch {batch}, "
        f"{steps} steps x {repeats} interleaved repeats"
    )
    print(f"expected training-MAC saving of the drawn gates: {expected:.2%}")
    print("  variant  ms/step  saving vs dense  realized/expected  (min..max ms over repeats)")
    for name in variants:
        s = 1 - med[name] / med["dense"]
        ratio = f"{s / expected:8.3f}" if name in ("skip", "mask") else "       -"
        lo, hi = min(times[name]) * 1e3, max(times[name]) * 1e3
        print(
            f"  {name:>7}  {med[name] * 1e3:7.3f}  {s:+14.2%}  {ratio}"
            f"           ({lo:.3f}..{hi:.3f})"
        )
    print(f"  plain-PyTorch reference / Fathom dense step: {med['plain'] / med['dense']:.3f}")
    print("  topology  drawn-steps  time/dense  MAC ratio")
    for k in topologies:
        bits = "".join(str(int(b)) for b in k)
        print(
            f"  {bits:>8}  {sd_plan.kept.count(k):11d}  {statistics.median(topo_ratio[k]):10.3f}"
            f"  {train_macs(sd_model, k) / dense_macs:9.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width-mult", type=float, nargs="+", default=[0.5, 0.1])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--clock",
        choices=("thread", "wall"),
        default="thread",
        help="thread: CPU time of the calling thread (time.thread_time; with --threads 1 all "
        "of torch's work runs there, so time spent descheduled on a shared machine is not "
        "counted); wall: time.perf_counter",
    )
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "thread" else time.perf_counter
    torch.set_num_threads(args.threads)
    tuned = tune_cpu_allocator()
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cpus, "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"allocator tuned: {tuned}, clock: {args.clock}, "
        f"load average at start: {os.getloadavg()[0]:.2f}"
    )
    for w in args.width_mult:
        bench_width(w, args.steps, args.repeats, args.batch)


if __name__ == "__main__":
    main()
