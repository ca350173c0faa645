"""What a loss argument costs in the exact diagonals: [N, C] against the same model read
per token ([N, T, V]), and the memory bound by groups of output directions.

A token model (Embedding -> Linear -> tanh -> Linear head over ``V`` classes) on ``N``
sequences of ``T`` tokens: ``exact_diagonals(..., families="ggn")`` with the head on the
mean token (``[N, V]``, cross-entropy over the pooled output) and on every token
(``[N, T, V]``, ``class_dim=-1``, ``T (V - 1)`` GGN directions per example), and the latter
again under a budget that forces groups of directions (``--budget`` elements). Timed on
the calling thread's CPU clock (``time.thread_time``: other jobs on a shared machine do not
enter), one warm-up, ``--repeats`` interleaved rounds, medians; the grouped result is
checked equal to the ungrouped one.

Usage: python bench/bench_losses.py [--batch 16] [--tokens 8] [--vocab 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from torch import nn

import fathom.curvature.exact as exact
from fathom.curvature import exact_diagonals


class Tokens(nn.Module):
    def __init__(self, vocab: int, d: int, pooled: bool) -> None:
        super().__init__()
        self.emb, self.mid, self.head = nn.Embedding(vocab, d), nn.Linear(d, d), nn.Linear(d, vocab)
        self.pooled = pooled

    def forward(self, x):
        h = torch.tanh(self.mid(self.emb(x)))
        return self.head(h.mean(1) if self.pooled else h)


def _time(fn) -> float:
    t = time.thread_time()
    fn()
    return time.thread_time() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=100)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=int, default=2**20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n, t, v = args.batch, args.tokens, args.vocab
    pooled, per_token = Tokens(v, args.width, True), Tokens(v, args.width, False)
    per_token.load_state_dict(pooled.state_dict())
    x = torch.randint(0, v, (n, t))
    y_pooled, y_tokens = torch.randint(0, v, (n,)), torch.randint(0, v, (n, t))
    runs = {
        "[N, V] pooled": lambda: exact_diagonals(pooled, x, y_pooled, families="ggn"),
        "[N, T, V] per token": lambda: exact_diagonals(
            per_token, x, y_tokens, families="ggn", class_dim=-1
        ),
    }
    full = runs["[N, T, V] per token"]()
    default_budget = exact._ELEMENTS

    def grouped():
        exact._ELEMENTS = args.budget
        try:
            return exact_diagonals(per_token, x, y_tokens, families="ggn", class_dim=-1)
        finally:
            exact._ELEMENTS = default_budget

    runs[f"[N, T, V] per token, budget {args.budget}"] = grouped
    worst = max(
        float((a - full["ggn"][k]).abs().max() / full["ggn"][k].abs().max().clamp_min(1e-300))
        for k, a in grouped()["ggn"].items()
    )
    for fn in runs.values():
        fn()  # warm-up (discovery, twin)
    times = {k: [] for k in runs}
    for _ in range(args.repeats):
        for k, fn in runs.items():
            times[k].append(_time(fn))
    print(f"machine: {platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.2f}")
    print(f"N={n} T={t} V={v} width={args.width}, {args.repeats} rounds, thread CPU medians")
    base = statistics.median(times["[N, V] pooled"])
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"  {k:<42} {1e3 * m:9.1f} ms  {m / base:6.2f}x pooled")
    print(f"grouped vs ungrouped GGN: max relative difference {worst:.2e}")


if __name__ == "__main__":
    main()
