"""The language model's training speed: Fathom's trainer against a plain PyTorch loop, and
LayerDrop's realized against its expected saving.

**Overhead.** Each round trains the same ``gpt`` model (same seeded weights, batches, rates,
AdamW, clipping, token cross-entropy; dense, no LayerDrop) on the same Moby Dick windows
twice, in alternating order: once through :func:`fathom.train.loop.train` (what ``fathom
train`` runs: its run directory, manifest, checkpoints at the boundaries) timed by the run's
own CPU training clock ``clock/training_cpu_s`` (the training thread's CPU time over the
optimizer steps), and once as a plain loop a user would write around the same module
(``loss.backward(); clip_grad_norm_; opt.step(); opt.zero_grad()``), timed by
``time.thread_time`` over its steps. Tokens/s = steps · batch · context / seconds; the ratio
``T_fathom / T_plain`` is paired within a round; its median over rounds is the figure.

**LayerDrop.** At each width, each round trains the model dense and with LayerDrop
(``layerdrop = p`` on every block) through :func:`~fathom.train.loop.train`, same batches.
Expected saving = the share of training multiply-accumulates the drawn gates skip::

    per token, forward:  block = 12 d² + 2 T d   (q, k, v, o: 4 d²; MLP: 8 d²; scores and
                                                  their product with v: 2 T d, unmasked)
                         head  = d V             (tied output projection)
    expected = mean over steps of Σ_l (1 - kept_l) · block / (L · block + head)

(backward ≈ 2 × forward for every term, so the ratio is the same in training); realized =
``1 - T_layerdrop / T_dense`` on the CPU training clock, paired per round.

CPU: one torch thread (``torch.set_num_threads(1)``), the thread CPU clock (time spent
descheduled on a shared machine is not counted). Prints the machine, load and repeats.

Usage: python bench/bench_lm.py [--rounds 5] [--fit 256] [--widths 64 192] [--p 0.3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fathom.config import validate_run_config
from fathom.data.prepare import prepare_splits
from fathom.rundir import RunDir
from fathom.train.build import build_optimizer, init_model, stream_seed
from fathom.train.loop import train
from fathom.train.schedule import epoch_lrs


def config(width: int, layers: int, context: int, batch: int, fit: int, p: float):
    return validate_run_config(
        {
            "name": "bench",
            "study": "bench",
            "seed": 0,
            "device": "cpu",
            "data": {
                "dataset": "moby-dick",
                "context": context,
                "fit_subset": fit,
                "eval_subset": 8,
            },
            "model": {"kind": "gpt", "layers": layers, "width": width, "heads": 4, "layerdrop": p},
            "optim": {
                "name": "adamw",
                "lr": 3e-3,
                "betas": [0.9, 0.95],
                "weight_decay": 0.1,
                "clip_norm": 1.0,
                "batch_size": batch,
                "epochs": 1,
                "schedule": {"kind": "warmup_cosine", "warmup_epochs": 0.2, "final": 0.1},
            },
            "eval": {"first": [], "every": 1, "splits": ["val"], "batch_size": 64},
            "checkpoints": {"save_epochs": [1]},
            "execution": {"path": "eager", "precision": "fp32"},
        }
    )


def fathom_seconds(cfg) -> tuple[float, int, list]:
    """The trainer's CPU training clock of one run, its steps and the drawn gates' digest."""
    with tempfile.TemporaryDirectory() as d:
        res = train(cfg, Path(d) / "r")
        m = RunDir(res.run_dir).manifest
        return m["clocks"]["training_cpu_s"], m["steps_completed"], res.final_params


def plain_seconds(cfg, splits) -> tuple[float, str]:
    """The same model, batches, rates and update in a plain loop: its thread CPU seconds and
    its final parameters' digest (equal to the trainer's: the same computation)."""
    from fathom.base.io import state_dict_digest
    from fathom.models.gpt import token_cross_entropy
    from fathom.rundir.weights import cpu_state

    model = init_model(cfg, 256, cfg.data.context, (cfg.data.context,))
    opt = build_optimizer(model, cfg.optim)
    n = int(splits.fit_y.shape[0])
    gen = torch.Generator().manual_seed(stream_seed(cfg.seed, "shuffle"))
    perm = torch.randperm(n, generator=gen)
    bs = cfg.optim.batch_size
    steps = (n + bs - 1) // bs
    lrs = epoch_lrs(cfg.optim, 1, steps)
    model.train()
    t0 = time.thread_time()
    for i in range(steps):
        idx = perm[i * bs : (i + 1) * bs]
        loss = token_cross_entropy(model(splits.fit_x[idx]), splits.fit_y[idx])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip_norm)
        for group in opt.param_groups:
            group["lr"] = lrs[i]
        opt.step()
        opt.zero_grad(set_to_none=True)
    seconds = time.thread_time() - t0
    return seconds, state_dict_digest(cpu_state(model))


def expected_saving(cfg, steps_kept: list[tuple[bool, ...]]) -> float:
    d, L, T, V = cfg.model.width, cfg.model.layers, cfg.data.context, 256
    block, head = 12 * d * d + 2 * T * d, d * V
    total = L * block + head
    return statistics.fmean(sum(not k for k in kept) * block / total for kept in steps_kept)


def drawn_gates(cfg, splits) -> list[tuple[bool, ...]]:
    """The gates the run's controller draws over its one epoch (same seeds as the run)."""
    from fathom.train.build import build_controller
    from fathom.train.plan import plan_epoch

    model = init_model(cfg, 256, cfg.data.context, (cfg.data.context,))
    controller = build_controller(model, cfg)
    gen = torch.Generator().manual_seed(stream_seed(cfg.seed, "shuffle"))
    n = int(splits.fit_y.shape[0])
    return plan_epoch(1, n, cfg.optim.batch_size, gen, controller, cfg.optim).kept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fit", type=int, default=256, help="fitting windows per run")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128, help="the overhead comparison's width")
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 192])
    ap.add_argument("--p", type=float, default=0.3)
    ap.add_argument("--skip-overhead", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()} "
        f"torch {torch.__version__}, 1 thread, load {os.getloadavg()[0]:.1f} at start"
    )
    tokens = lambda steps, cfg: steps * cfg.optim.batch_size * cfg.data.context  # noqa: E731
    if not args.skip_overhead:
        cfg = config(args.width, args.layers, args.context, args.batch, args.fit, 0.0)
        splits = prepare_splits(cfg.data)
        ratios, tf, tp = [], [], []
        for r in range(args.rounds):
            if r % 2:
                p_s, p_hash = plain_seconds(cfg, splits)
                f_s, steps, f_hash = fathom_seconds(cfg)
            else:
                f_s, steps, f_hash = fathom_seconds(cfg)
                p_s, p_hash = plain_seconds(cfg, splits)
            assert p_hash == f_hash, "the plain loop must compute what the trainer computes"
            ratios.append(f_s / p_s)
            tf.append(tokens(steps, cfg) / f_s)
            tp.append(tokens(steps, cfg) / p_s)
            print(f"  round {r}: fathom {f_s:.2f} s, plain {p_s:.2f} s, ratio {f_s / p_s:.3f}")
        print(
            f"overhead, width {args.width}, {args.layers} layers, T={args.context}, batch "
            f"{args.batch}, {steps} steps: fathom {statistics.median(tf):,.0f} tokens/s, plain "
            f"{statistics.median(tp):,.0f} tokens/s, ratio fathom/plain median "
            f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
            f"{args.rounds} rounds; final parameters identical in every round)"
        )
    for width in args.widths:
        dense = config(width, args.layers, args.context, args.batch, args.fit, 0.0)
        drop = config(width, args.layers, args.context, args.batch, args.fit, args.p)
        splits = prepare_splits(drop.data)
        expected = expected_saving(drop, drawn_gates(drop, splits))
        realized = []
        for r in range(args.rounds):
            pair = (dense, drop) if r % 2 == 0 else (drop, dense)
            secs = {id(c): fathom_seconds(c)[0] for c in pair}
            realized.append(1 - secs[id(drop)] / secs[id(dense)])
            print(
                f"  width {width} round {r}: dense {secs[id(dense)]:.2f} s, layerdrop "
                f"{secs[id(drop)]:.2f} s"
            )
        med = statistics.median(realized)
        print(
            f"LayerDrop p={args.p}, width {width}: expected saving {expected:.3f}, realized "
            f"median {med:.3f} (min {min(realized):.3f}, max {max(realized):.3f}), "
            f"realized/expected {med / expected:.2f}, {args.rounds} rounds"
        )
    print(f"load {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
