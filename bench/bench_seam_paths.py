"""What the generic seam paths cost against the fast ones.

The same model measured with every layer on its fast path, then with one layer made
generic by what the seam routes there: an identity forward hook (the function is
unchanged, but a hook could change it, so the fast path is not provably the same), a
parametrization (``weight_norm``), and a root parameter passed into a module's forward
(``foreign``: an additive per-feature bias given as an argument). Also a GRU (the
functional recurrent path) against the fused-kernel forward + backward of its batch.

Timed on the calling thread's CPU clock (``time.thread_time``, so the shared machine's
other jobs do not enter), one warm-up, ``--repeats`` interleaved rounds, medians:
``fathom.Instruments(..., families=("moments",)).observe()`` and
``fathom.curvature.exact_diagonals(..., families="ggn")``.

Usage: python bench/bench_seam_paths.py [--batch 64] [--width 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations

import fathom
from fathom.curvature import exact_diagonals


class Shift(nn.Module):
    def forward(self, h: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        return h + shift


class MLP(nn.Module):
    def __init__(self, width: int, variant: str) -> None:
        super().__init__()
        first = nn.Linear(784, width)
        if variant == "parametrization":
            first = parametrizations.weight_norm(first)
        self.l1, self.l2, self.head = first, nn.Linear(width, width), nn.Linear(width, 10)
        self.shift = Shift()
        self.bias = nn.Parameter(torch.zeros(width)) if variant == "foreign" else None
        if variant == "hook":
            self.l1.register_forward_hook(lambda m, a, o: o)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.l1(x))
        if self.bias is not None:
            h = self.shift(h, self.bias)
        return self.head(torch.tanh(self.l2(h)))


class GRUNet(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.gru, self.head = nn.GRU(28, width, batch_first=True), nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x.reshape(x.shape[0], 28, 28))
        return self.head(out[:, -1])


def timed(fn, repeats: int) -> float:
    fn()
    out = []
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        out.append(time.thread_time() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--gru-width", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread,")
    print(
        f"# load {os.getloadavg()[0]:.2f}, N={args.batch}, width={args.width}, repeats={args.repeats}"
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 784, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    rows = []
    for variant in ("fast", "hook", "parametrization", "foreign"):
        torch.manual_seed(0)
        model = MLP(args.width, variant).eval()
        ins = fathom.Instruments(model, x, y, families=("moments",))
        t_obs = timed(ins.observe, args.repeats)
        t_ggn = timed(lambda m=model: exact_diagonals(m, x, y, families="ggn"), args.repeats)
        rows.append((variant, t_obs, t_ggn, ins.seam.coverage_table().count("generic")))
    base = rows[0]
    print("| model | generic params | observe (moments) s | x fast | GGN diagonal s | x fast |")
    print("|---|---|---|---|---|---|")
    for v, t_obs, t_ggn, generic in rows:
        print(
            f"| MLP {v} | {generic} | {t_obs:.4f} | {t_obs / base[1]:.2f} | {t_ggn:.4f} | "
            f"{t_ggn / base[2]:.2f} |"
        )
    torch.manual_seed(0)
    gru = GRUNet(args.gru_width).eval()
    ins = fathom.Instruments(gru, x, y, families=("moments",))
    t_obs = timed(ins.observe, args.repeats)
    t_ggn = timed(lambda: exact_diagonals(gru, x, y, families="ggn"), args.repeats)

    def step() -> None:
        loss = F.cross_entropy(gru(x), y)
        torch.autograd.grad(loss, list(gru.parameters()))

    t_step = timed(step, args.repeats)
    print(
        f"| GRU {args.gru_width} (recurrent) | - | {t_obs:.4f} | {t_obs / t_step:.2f} x fwd+bwd "
        f"| {t_ggn:.4f} | {t_ggn / t_step:.2f} x fwd+bwd |"
    )
    print(f"# GRU fused forward + backward of the batch: {t_step:.4f} s")


if __name__ == "__main__":
    main()
