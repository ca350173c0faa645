"""Does stochastic depth save the work it skips?  Timed through the trainer's own step path.

Every variant runs :class:`fathom.train.steppers.EagerStepper.run_epoch` — the code `fathom train`
runs on the CPU — over :class:`~fathom.train.plan.EpochPlan` s of the same batches:

* ``dense``:  recipe ``residual`` (no controller; every branch computed at gain one)
* ``skip``:   recipe ``sd_constant`` with the gates the run's controller draws (p = 0.1..0.4);
              a dropped branch is not called
* ``skip_ref``: the same, with the kept branches' gain as a Python float (``bypass + out * g``,
              the form before the gain tensor; ``sd_harness.reference_gain``): before / after, paired
* ``mask``:   the same model and gates, but every branch computed and multiplied by its gain
              (timm/torchvision-style DropPath: regularises, saves nothing)
* ``dense_b``: a second, identical dense model and stepper (an A/A control: its ratio to
              ``dense`` is the measurement's own bias and noise, memory placement included)
* ``plain``:  the same network written as a user would, an ordinary ``nn.Module`` with
              ``torch.optim.SGD`` in a plain loop (float inputs, defaults), no Fathom code

Expected saving = E[sum_l (1 - kept_l) * 3 * in_l * out_l] / train_macs(dense), over the gates
actually drawn, where an affine layer costs 3 * in * out multiply-accumulates per example in
training (forward, input gradient, weight gradient) and the stem 2 * (no input gradient).
Realized saving = 1 - T_skip / T_dense.

The measurement (why: docs/benchmarks-history.md#sd-cpu). The benchmark thread is
pinned to one CPU and timed on its own CPU clock (``time.thread_time``: time spent
descheduled on the shared machine is not counted). Each variant's plan is cut into blocks of
``--block`` steps; a *round* runs block 1 of every variant, then block 2 of every variant, ...
(the variants' order rotating from block to block), so every variant sees the same machine
state within a few tens of milliseconds and the ratio ``T_v / T_dense`` of one round cancels
the slow drift of the other engineers' load. By default (``--rebuild``) every round runs on
freshly built models, optimizers and steppers (same seeds and plans): one instance's memory
placement biased the A/A control by up to 5% at × 0.5. ``--data mnist`` trains on the
product's data (real MNIST) instead of random bytes. Reported: the median over rounds of that
paired ratio (and its spread over rounds), and the median ms/step. The per-topology table times
plans whose every step has one topology (gain 1/(1-p) for kept branches), each block paired
with a dense block run just before it.

Usage: python bench/bench_sd_skip.py [--width-mult 0.5 0.1] [--steps 100] [--rounds 15]
                                    [--block 25] [--cpu N] [--clock thread|wall]
                                    [--no-rebuild] [--data synthetic|mnist]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import sd_harness
from fathom.config import RunConfig
from fathom.data import DataSplits
from fathom.depth import find_branches
from fathom.models.ciresan import CiresanMLP
from fathom.train.allocator import tune_cpu_allocator
from fathom.train.build import build_controller, build_optimizer, init_model
from fathom.train.plan import EpochPlan, plan_epoch
from fathom.train.steppers import EagerStepper
from sd_harness import Block, blocks_of, interleaved_rounds, on_reference, topology_rounds

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


def bench_splits(n: int, batch: int) -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x8 = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return DataSplits(x8, y, x8[:batch], y[:batch], x8[:batch], y[:batch], split_hash="bench")


def bench_config(recipe: str, width_mult: float, batch: int) -> RunConfig:
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


@functools.cache
def mnist_splits(n: int, batch: int) -> DataSplits:
    """The product's data: the first ``n`` fitting images of real MNIST (``fathom data fetch
    mnist``), as ``fathom train --set data.fit_subset=n`` reads them (read once: every
    rebuilt round shares them, read-only)."""
    from fathom.data.prepare import prepare_splits

    cfg = bench_config("residual", 1.0, batch).with_updates(
        {"data.fit_subset": n, "data.eval_subset": batch}
    )
    return prepare_splits(cfg.data)


def build_variants(
    width_mult: float, steps: int, batch: int, block: int, warm: int, data: str = "synthetic"
) -> dict:
    """The four variants' block callables, the per-topology blocks, the models and the plan."""
    n = steps * batch
    splits = mnist_splits(n, batch) if data == "mnist" else bench_splits(n, batch)
    cpu = torch.device("cpu")
    dense_cfg, sd_cfg = (
        bench_config("residual", width_mult, batch),
        bench_config("sd_constant", width_mult, batch),
    )
    dense_model, sd_model = init_model(dense_cfg), init_model(sd_cfg)
    twin = init_model(dense_cfg)  # the A/A control: a second, identical dense model
    controller = build_controller(sd_model, sd_cfg)
    dense_step = EagerStepper(
        dense_model, build_optimizer(dense_model, dense_cfg.optim), None, splits, cpu
    )
    twin_step = EagerStepper(twin, build_optimizer(twin, dense_cfg.optim), None, splits, cpu)
    sd_step = EagerStepper(
        sd_model, build_optimizer(sd_model, sd_cfg.optim), controller, splits, cpu
    )
    sd_plan = plan_epoch(1, n, batch, torch.Generator().manual_seed(1), controller, sd_cfg.optim)
    dense_plan = EpochPlan(
        1, sd_plan.perm, [()] * steps, [()] * steps, torch.ones(steps, 0), sd_plan.lrs, batch
    )
    plain = PlainResidualMLP(dense_model.widths)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9)
    xf = splits.fit_x.reshape(n, -1).float() / 255

    def run_mask(p: EpochPlan) -> None:
        mask_mode(sd_model, True)
        try:
            sd_step.run_epoch(p)
        finally:
            mask_mode(sd_model, False)

    runners: dict[str, Callable[[EpochPlan], object]] = {
        "dense": dense_step.run_epoch,
        "dense_b": twin_step.run_epoch,
        "skip": sd_step.run_epoch,
        "skip_ref": on_reference(sd_step.run_epoch),
        "mask": run_mask,
        "plain": lambda p: plain_epoch(plain, plain_opt, xf, splits.fit_y, p.perm, batch),
    }

    def blocks(name: str, plan: EpochPlan) -> list[Block]:
        run = runners[name]
        out: list[Block] = []
        for p in blocks_of(plan, block):
            head = blocks_of(p, warm)[0] if warm else None
            out.append((lambda h=head: h is not None and run(h), lambda p=p: run(p)))
        return out

    # compute-then-mask updates every parameter (a masked branch's gradient is zero, its
    # momentum and weight decay still act, as with timm's DropPath): every branch "kept"
    # for the update, the drawn gains (0 for a dropped branch) multiplying the branches
    mask_plan = EpochPlan(
        1,
        sd_plan.perm,
        [(True,) * 4] * steps,
        sd_plan.gain_values,
        sd_plan.gains,
        sd_plan.lrs,
        batch,
    )
    plans = {
        "dense": dense_plan,
        "dense_b": dense_plan,
        "skip": sd_plan,
        "skip_ref": sd_plan,
        "mask": mask_plan,
        "plain": sd_plan,
    }
    variants = {name: blocks(name, plans[name]) for name in runners}
    topologies = sorted(set(sd_plan.kept), key=lambda k: -sd_plan.kept.count(k))
    topologies += [k for k in itertools.product((True, False), repeat=4) if k not in topologies]
    topo = {k: blocks("skip", fixed_plan(sd_plan, k)) for k in topologies}
    topo_ref = {"1111 ref": blocks("skip_ref", fixed_plan(sd_plan, (True,) * 4))}
    return {
        "variants": variants,
        "topo": topo,
        "topo_ref": topo_ref,
        "dense_model": dense_model,
        "sd_model": sd_model,
        "plan": sd_plan,
    }


def report(width_mult: float, built: dict, times: dict, topo_ratio: dict, args) -> None:
    dense_model, sd_model, plan = built["dense_model"], built["sd_model"], built["plan"]
    steps = plan.steps
    dense_macs = train_macs(dense_model)
    expected = 1 - statistics.mean(train_macs(sd_model, k) for k in plan.kept) / dense_macs
    per_round = {k: [sum(r) for r in v] for k, v in times.items()}
    ratio = {
        k: [t / d for t, d in zip(v, per_round["dense"], strict=True)] for k, v in per_round.items()
    }
    # the lower envelope: every block at its fastest over the rounds (contention only slows)
    floor = {k: sum(min(col) for col in zip(*v, strict=True)) for k, v in times.items()}
    print(
        f"\nwidth x {width_mult}: widths {dense_model.widths}, batch {args.batch}, {steps} steps "
        f"in blocks of {args.block} (after {args.warm} untimed) x {args.rounds} interleaved rounds"
        f"{' on fresh instances' if args.rebuild else ''} "
        f"(load average now {os.getloadavg()[0]:.2f})"
    )
    print(f"expected training-MAC saving of the drawn gates: {expected:.2%}")
    print(
        "  variant  ms/step  T/T_dense: median of paired rounds (min..max)  realized/expected"
        "  | block-minimum: T/T_dense  realized/expected"
    )
    for name in times:
        med_ms = statistics.median(per_round[name]) / steps * 1e3
        r, f = statistics.median(ratio[name]), floor[name] / floor["dense"]
        sd = name in ("skip", "skip_ref", "mask")
        real = f"{(1 - r) / expected:8.3f}" if sd else "       -"
        real_f = f"{(1 - f) / expected:8.3f}" if sd else "       -"
        print(
            f"  {name:>7}  {med_ms:7.3f}  {r:.4f} ({min(ratio[name]):.3f}..{max(ratio[name]):.3f})"
            f"                     {real}  |   {f:.4f}   {real_f}"
        )
    print(
        f"  plain-PyTorch reference / Fathom dense step: {statistics.median(ratio['plain']):.3f}"
        f" (block-minimum {floor['plain'] / floor['dense']:.3f})"
    )
    print("  topology  drawn-steps  time/dense (paired median, block-minimum)  MAC ratio  offset")
    for k, (dense_t, topo_t) in topo_ratio.items():
        bits = k if isinstance(k, str) else "".join(str(int(b)) for b in k)
        mac = train_macs(sd_model, (True,) * 4 if isinstance(k, str) else k) / dense_macs
        med = statistics.median(t / d for t, d in zip(topo_t, dense_t, strict=True))
        low = min(topo_t) / min(dense_t)
        print(
            f"  {bits:>8}  {plan.kept.count(k) if not isinstance(k, str) else 0:11d}  {med:10.3f}  {low:10.3f}"
            f"                      {mac:9.3f}  {med - mac:+6.3f}"
        )


def rebuilt_rounds(width_mult: float, args) -> dict[str, list[list[float]]]:
    """:func:`interleaved_rounds` with every model, optimizer and stepper built afresh (same
    seeds, same plans) before each round, so that where the allocator placed one instance's
    weights (an A/A bias of up to 5% at × 0.5 on one instance) averages out over rounds."""
    times: dict[str, list[list[float]]] = {}
    for r in range(args.rounds):
        variants = build_variants(
            width_mult, args.steps, args.batch, args.block, args.warm, args.data
        )["variants"]
        for blocks in variants.values():  # first touch of this instance's buffers, untimed
            blocks[0][1]()
        turn = r * len(variants["dense"])  # the rotation continues across rounds
        for name, rows in interleaved_rounds(variants, 1, turn).items():
            times.setdefault(name, []).extend(rows)
    return times


def bench_width(width_mult: float, args) -> None:
    built = build_variants(width_mult, args.steps, args.batch, args.block, args.warm, args.data)
    variants = built["variants"]
    topo = {**built["topo"], **built["topo_ref"]}  # + all-kept on the out-of-place gain
    for blocks in [*variants.values(), *topo.values()]:  # warm-up: buffers, allocator, caches
        for _, run in blocks:
            run()
    if args.rebuild:
        times = rebuilt_rounds(width_mult, args)
    else:
        times = interleaved_rounds(variants, args.rounds)
    topo_ratio = topology_rounds(variants["dense"], topo, args.topo_rounds or args.rounds)
    report(width_mult, built, times, topo_ratio, args)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width-mult", type=float, nargs="+", default=[0.5, 0.1])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--topo-rounds", type=int, default=0, help="0: as many as --rounds")
    ap.add_argument("--block", type=int, default=25, help="steps per interleaved block")
    ap.add_argument(
        "--warm",
        type=int,
        default=1,
        help="untimed steps of the same variant before each timed block (0: time cold switches)",
    )
    ap.add_argument(
        "--rebuild",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fresh model instances before every round (instance placement averaged; the "
        "topology rows keep the first build)",
    )
    ap.add_argument(
        "--data",
        choices=("synthetic", "mnist"),
        default="synthetic",
        help="synthetic: uniform random bytes and labels; mnist: real MNIST, the product's data",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpu", type=int, default=-1, help="pin to this CPU (-1: the last one)")
    ap.add_argument(
        "--clock",
        choices=("thread", "wall"),
        default="thread",
        help="thread: CPU time of the calling thread (time.thread_time; with --threads 1 all "
        "of torch's work runs there, so time spent descheduled on a shared machine is not "
        "counted); wall: time.perf_counter",
    )
    args = ap.parse_args()
    sd_harness.CLOCK = time.thread_time if args.clock == "thread" else time.perf_counter
    cpu = args.cpu if args.cpu >= 0 else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(args.threads)
    tuned = tune_cpu_allocator()
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cpus, "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, pinned to cpu {cpu}, "
        f"allocator tuned: {tuned}, clock: {args.clock}, "
        f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    for w in args.width_mult:
        bench_width(w, args)


if __name__ == "__main__":
    main()
