"""Does stochastic depth save the work it skips?  Dense vs skipping SD vs compute-then-mask SD.

Times SGD training steps (forward, backward, momentum update) of the Ciresan residual MLP at
a CPU-sized width, three ways, with the same batches and the same gate decisions:

* dense:            every branch computed (recipe ``residual``)
* skip SD:          ``fathom.depth`` — a dropped branch is not called at all
* compute-then-mask: a few-line imitation of timm's batch-wise DropPath (branch computed,
                     then multiplied by ``kept / survival``)

Expected saving = sum_l p_l * train_macs(branch_l) / train_macs(dense), where an affine layer
costs 3 * in * out multiply-accumulates per example in training (forward, input gradient,
weight gradient), except the stem (2x: no input gradient). Realized saving =
1 - T_variant / T_dense, where T is the sum over the step sequence of each step's median
over the interleaved repeats (robust to allocator and scheduler spikes on a shared machine;
the mean-of-loop figure is printed beside it), plus the time ratio per branch topology.

Usage: python bench/bench_sd_skip.py [--width-mult 0.5] [--batch 64] [--steps 40] [--repeats 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from fathom.depth import DropSchedule, GateController, drop_path_compute_then_mask
from fathom.models.ciresan import CiresanMLP
from fathom.train.allocator import tune_cpu_allocator


def train_macs(model: CiresanMLP, kept: tuple[int, ...] | None = None) -> int:
    layers = model.affine_layers()
    kept = kept or (1,) * (len(layers) - 2)
    total = 2 * layers[0].in_features * layers[0].out_features
    total += 3 * layers[-1].in_features * layers[-1].out_features
    for lin, k in zip(layers[1:-1], kept, strict=True):
        total += 3 * lin.in_features * lin.out_features * k
    return total


def masked_forward(
    model: CiresanMLP, x: torch.Tensor, kept: tuple[bool, ...], probs
) -> torch.Tensor:
    """timm-style: every branch computed, then scaled by kept / survival."""
    h = F.relu(model.stem(model.prepare(x)))
    for block, k, p in zip(model.blocks, kept, probs, strict=True):
        h = F.relu(drop_path_compute_then_mask(h, block.res.branch, block.res.bypass, k, 1 - p))
    return model.head(h)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width-mult", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-allocator-tuning", action="store_true")
    args = ap.parse_args()
    probs = (0.1, 0.2, 0.3, 0.4)
    tuned = False if args.no_allocator_tuning else tune_cpu_allocator()

    torch.manual_seed(0)
    model = CiresanMLP(recipe="sd_constant", width_mult=args.width_mult)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    ctrl = GateController(model.branches(), DropSchedule("constant", probs), seed=1)
    xs = torch.randint(0, 256, (args.steps, args.batch, 784), dtype=torch.uint8)
    ys = torch.randint(0, 10, (args.steps, args.batch))
    gates = [ctrl.draw(0) for _ in range(args.steps)]

    def step(forward) -> None:
        loss = F.cross_entropy(forward(), ys_i)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def run(kind: str) -> list[float]:
        """Seconds of each step of the sequence (same batches, same gates)."""
        nonlocal ys_i
        out = []
        for i in range(args.steps):
            x, ys_i = xs[i], ys[i]
            kept, gains = gates[i]
            t0 = time.perf_counter()
            if kind == "dense":
                ctrl.release()
                step(lambda x=x: model(x))
            elif kind == "skip":
                ctrl.set_gains(gains)
                step(lambda x=x: model(x))
            else:
                ctrl.release()
                step(lambda x=x, kept=kept: masked_forward(model, x, kept, probs))
            out.append(time.perf_counter() - t0)
        return out

    ys_i = ys[0]
    for kind in ("dense", "skip", "mask"):  # warm-up
        run(kind)
    times: dict[str, list[list[float]]] = {"dense": [], "skip": [], "mask": []}
    for _ in range(args.repeats):
        for kind in times:
            times[kind].append(run(kind))
    # per-step median over the interleaved repeats (robust to allocator and scheduler spikes),
    # summed over the sequence; the mean-of-loop figure is printed beside it
    robust = {
        k: sum(statistics.median(col) for col in zip(*v)) / args.steps for k, v in times.items()
    }
    loop = {k: statistics.median(sum(r) / args.steps for r in v) for k, v in times.items()}

    dense_macs = train_macs(model)
    realized_kept = [tuple(int(k) for k in g[0]) for g in gates]
    expected = (
        sum(
            p * 3 * lin.in_features * lin.out_features
            for p, lin in zip(probs, model.affine_layers()[1:-1], strict=True)
        )
        / dense_macs
    )
    sampled = 1 - statistics.mean(train_macs(model, k) for k in realized_kept) / dense_macs
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, glibc allocator tuned: {tuned}"
    )
    print(
        f"model: widths {model.widths}, batch {args.batch}, {args.steps} steps x {args.repeats} "
        "repeats (interleaved)"
    )
    print(
        f"expected MAC saving (schedule p=0.1..0.4): {expected:.1%}; for the gates actually drawn: "
        f"{sampled:.1%}"
    )
    print("  variant   per-step-median  saving  realized/expected | loop-mean  saving")
    for kind in ("dense", "skip", "mask"):
        s_r = 1 - robust[kind] / robust["dense"]
        s_l = 1 - loop[kind] / loop["dense"]
        print(
            f"  {kind:>7}  {robust[kind] * 1e3:9.2f} ms  {s_r:+7.1%}  {s_r / sampled:8.2f}"
            f"          | {loop[kind] * 1e3:7.2f} ms  {s_l:+6.1%}"
        )
    by_topology: dict[tuple[int, ...], list[float]] = {}
    dense_steps = [statistics.median(col) for col in zip(*times["dense"])]
    skip_steps = [statistics.median(col) for col in zip(*times["skip"])]
    for k, d, t in zip(realized_kept, dense_steps, skip_steps, strict=True):
        by_topology.setdefault(k, []).append(t / d)
    print("  topology (branch 0 first)  steps  time ratio to dense  MAC ratio (training)")
    for k, v in sorted(by_topology.items(), key=lambda kv: -len(kv[1])):
        print(
            f"  {''.join(map(str, k))}                       {len(v):5d}  {statistics.median(v):6.3f}"
            f"               {train_macs(model, k) / dense_macs:6.3f}"
        )


if __name__ == "__main__":
    main()
