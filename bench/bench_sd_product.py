"""The saving through the product: training clocks of real ``fathom train`` runs.

``residual`` vs ``sd_constant`` (p = 0.1/0.2/0.3/0.4) at fixed exposure — the same data
subset, batches and epochs, telemetry off, one thread — each run a separate ``fathom train``
process pinned to one CPU, the two recipes alternating over the repeats. Compared, per
epoch: the product's two training clocks (optimizer steps only; every history row carries
them cumulatively): ``clock/training_cpu_s``, the training thread's CPU time (the figure
quoted: other jobs on a shared machine disturb it least), and ``clock/training_s``, wall
time (printed beside it). Epoch 1 (first-touch of every buffer) is left out, a run's figure
is the median of its other epochs' clocks, and a recipe's figure the median over its runs.

Expected saving = the share of training MACs (``bench/bench_sd_skip.train_macs``) of the
branches the run actually dropped in the timed epochs: the run's gates are replayed from its
config (the controller's own generator) and checked against the mask digest in its manifest.
Realized = 1 - T_sd / T_residual.

Usage: python bench/bench_sd_product.py [--width-mult 0.5 0.1] [--repeats 3] [--fit 6400]
                                        [--epochs 6] [--cpu N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_sd_skip import train_macs
from fathom.config import RunConfig
from fathom.train.build import build_controller, init_model
from fathom.train.state import GENESIS, chain

RECIPES = ("residual", "sd_constant")


def train_once(
    recipe: str, width_mult: float, args: argparse.Namespace, runs: Path, tag: str
) -> Path:
    """One pinned ``fathom train`` process; returns its run directory."""
    sets = {
        "model.recipe": recipe,
        "model.width_mult": width_mult,
        "optim.lr": 0.01,
        "optim.epochs": args.epochs,
        "data.fit_subset": args.fit,
        "data.eval_subset": 500,
        "telemetry.enabled": "false",
        "eval.every": 1,
        "device": "cpu",
    }
    cmd = [sys.executable, "-m", "fathom.cli", "train", "--quiet", "--runs-dir", str(runs)]
    cmd += ["--name", tag]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        cmd,
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        preexec_fn=lambda: os.sched_setaffinity(0, {args.cpu}),
    )
    return next(runs.glob(f"*/{tag}/manifest.json")).parent


CLOCKS = {"cpu": "clock/training_cpu_s", "wall": "clock/training_s"}


def epoch_clocks(run_dir: Path, field: str = CLOCKS["cpu"]) -> list[float]:
    """Training-clock seconds of epochs 1..E (differences of the cumulative history clock)."""
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    cum = {r["epoch"]: r[field] for r in rows if field in r}
    epochs = sorted(cum)
    return [cum[b] - cum[a] for a, b in itertools.pairwise(epochs)]


def drawn_saving(run_dir: Path, first_epoch: int) -> float:
    """The dropped share of training MACs over epochs ``first_epoch..E``, from the replayed gates.

    The gates are drawn again from the run's config (the controller's seeded generator, in
    the trainer's order) and their digest is checked against the manifest's ``masks`` hash.
    """
    manifest = json.loads((run_dir / "manifest.json").read_text())
    cfg = RunConfig.model_validate(manifest["config"])
    model = init_model(cfg)
    controller = build_controller(model, cfg)
    steps = -(-cfg.data.fit_subset // cfg.optim.batch_size)
    digest, kept = GENESIS, []
    for epoch in range(1, cfg.optim.epochs + 1):
        drawn = [controller.draw(epoch - 1)[0] for _ in range(steps)]
        digest = chain(digest, bytes(int(k) for step in drawn for k in step))
        if epoch >= first_epoch:
            kept += drawn
    if digest != manifest["hashes"]["masks"]:
        raise SystemExit(f"{run_dir}: replayed gates do not match the run's mask digest")
    return 1 - statistics.mean(train_macs(model, k) for k in kept) / train_macs(model)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width-mult", type=float, nargs="+", default=[0.5, 0.1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fit", type=int, default=6400)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--cpu", type=int, default=-1, help="pin the runs to this CPU (-1: the last)")
    args = ap.parse_args()
    args.cpu = args.cpu if args.cpu >= 0 else max(os.sched_getaffinity(0))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at start: {load}; {os.cpu_count()} cpus; one thread, cpu {args.cpu}")
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.width_mult:
            per_run = {c: {"residual": [], "sd_constant": []} for c in CLOCKS}
            expected = []
            for r in range(args.repeats):
                for recipe in RECIPES if r % 2 == 0 else RECIPES[::-1]:
                    run = train_once(recipe, w, args, Path(tmp), f"{recipe}-w{w}-r{r}")
                    for clock, field in CLOCKS.items():
                        per_run[clock][recipe].append(
                            statistics.median(epoch_clocks(run, field)[1:])
                        )
                    if recipe == "sd_constant":
                        expected.append(drawn_saving(run, first_epoch=2))
            exp = statistics.mean(expected)
            print(f"width x {w}: expected saving (drawn gates) {exp:.2%}")
            for clock in CLOCKS:
                report(clock, per_run[clock], exp, args.epochs)
            print(f"  (load now {os.getloadavg()[0]:.2f})")


def report(clock: str, per_run: dict[str, list[float]], exp: float, epochs: int) -> None:
    """One clock's line: per-run epoch medians, the recipes' medians, realized / expected."""
    t_res = statistics.median(per_run["residual"])
    t_sd = statistics.median(per_run["sd_constant"])
    real = 1 - t_sd / t_res
    fmt = lambda v: ", ".join(f"{t:.3f}" for t in v)  # noqa: E731
    # each repeat's two runs ran back to back: their ratio is one paired sample, and the
    # spread of those samples is what this figure can resolve (runs of one recipe vary by
    # several percent of an epoch from process to process on a shared host)
    pairs = [
        (1 - sd / res) / exp
        for res, sd in zip(per_run["residual"], per_run["sd_constant"], strict=True)
    ]
    print(
        f"  {clock:4} clock, s per epoch (median of epochs 2..{epochs}): residual "
        f"[{fmt(per_run['residual'])}], sd_constant [{fmt(per_run['sd_constant'])}]; "
        f"medians {t_res:.3f} / {t_sd:.3f}; realized {real:+.2%}, "
        f"realized/expected {real / exp:.2f} (per repeat: {', '.join(f'{x:.2f}' for x in pairs)})"
    )
    if len(pairs) >= 3:
        from scipy import stats

        mean, sem = statistics.fmean(pairs), stats.sem(pairs)
        lo, hi = stats.t.interval(0.95, len(pairs) - 1, loc=mean, scale=sem)
        print(
            f"  {clock:4} clock, paired realized/expected: mean {mean:.2f}, 95% t-interval "
            f"[{lo:.2f}, {hi:.2f}] over {len(pairs)} repeats"
        )


if __name__ == "__main__":
    main()
