"""Depth-scaling model throughput and the Lyapunov regularizer's cost, side by side.

Measures, at CPU size (widths (4, 8, 16, 32) = width_mult 1/16, 1×32×32 inputs, 10 classes,
batch 64), for a depth-8 StagedConvNet:

* training images/s of the ANN and of the spiking net (LIF, T=4): one step = forward,
  CE backward (``regularized_gradients`` with λ_reg = 0, no measurement), SGD step;
* the regularized step (λ_reg = 0.3, λ̂ on a sub-batch of 16) relative to the vanilla step;
* one regularizer evaluation alone (λ̂ by JVPs on the sub-batch + the penalty's backward)
  relative to the vanilla step.

Variants are interleaved within every repeat (ratios survive a loaded machine better than
absolute times); medians over repeats are printed with the machine description.

Run: ``.venv/bin/python bench/bench_depthscale.py [--repeats 7] [--threads 1] [--device cpu]``
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from fathom.dynamics.lyapunov import model_lyapunov
from fathom.dynamics.regularizer import lyapunov_penalty, regularized_gradients
from fathom.models.convnet import StagedConvNet


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, steps: int, device: torch.device) -> float:
    """Seconds per call, ``steps`` calls after one warm-up call."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--width-mult", type=float, default=1 / 16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--classes", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    x = torch.randn(args.batch, args.channels, 32, 32, device=device)
    y = torch.randint(0, args.classes, (args.batch,), device=device)
    models = {
        name: StagedConvNet(
            blocks_per_stage=args.depth // 4,
            classes=args.classes,
            width_mult=args.width_mult,
            in_channels=args.channels,
            **kw,
        ).to(device)
        for name, kw in (("ann", {"neuron": "relu"}), ("snn_T4", {"neuron": "lif", "timesteps": 4}))
    }
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in models.items()}
    gen = torch.Generator().manual_seed(1)

    def step(name: str, weight: float):
        def fn() -> None:
            opts[name].zero_grad(set_to_none=True)
            regularized_gradients(
                models[name], x, y, weight=weight, sub_batch=16, measure=False, generator=gen
            )
            opts[name].step()

        return fn

    def reg_only(name: str):
        params = list(models[name].parameters())

        def fn() -> None:
            est = model_lyapunov(models[name], x[:16], generator=gen)
            torch.autograd.grad(0.3 * lyapunov_penalty(est.maximal), params, allow_unused=True)

        return fn

    variants = {}
    for name in models:
        variants[f"{name}/vanilla_step"] = step(name, 0.0)
        variants[f"{name}/regularized_step"] = step(name, 0.3)
        variants[f"{name}/regularizer_only"] = reg_only(name)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats):
        for k, fn in variants.items():
            times[k].append(timed(fn, args.steps, device))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"machine: {platform.processor() or platform.machine()}, {device}, threads={args.threads}, "
        f"torch {torch.__version__}; repeats={args.repeats} x {args.steps} steps (medians)"
    )
    print(
        f"setup: depth {args.depth}, widths {models['ann'].widths}, batch {args.batch}, "
        f"{args.channels}x32x32, {args.classes} classes, regularizer sub-batch 16"
    )
    for name in models:
        v = med[f"{name}/vanilla_step"]
        r = med[f"{name}/regularized_step"]
        o = med[f"{name}/regularizer_only"]
        print(
            f"{name}: vanilla step {v * 1e3:.1f} ms ({args.batch / v:.0f} img/s); "
            f"regularized step {r * 1e3:.1f} ms (x{r / v:.2f}); "
            f"regularizer alone {o * 1e3:.1f} ms (x{o / v:.2f} of a vanilla step)"
        )
    ratio = med["snn_T4/vanilla_step"] / med["ann/vanilla_step"]
    print(f"spiking T=4 step / ANN step: x{ratio:.2f}")


if __name__ == "__main__":
    main()
