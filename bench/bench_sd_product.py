"""The saving through the product: training clocks of real ``fathom train`` runs.

``residual`` vs ``sd_constant`` (p = 0.1/0.2/0.3/0.4) at fixed exposure — the same data
subset, batches and epochs, telemetry off, one thread — each run a separate ``fathom train``
process, interleaved over the repeats. The training clock (optimizer steps only, see the
manifest's ``clocks.training_s``) is compared, not elapsed time.

Expected saving = sum_l p_l * 3 * in_l * out_l / train_macs(dense) (the schedule's expectation,
training MACs as in ``bench/bench_sd_skip.py``); realized = 1 - min T_sd / min T_residual over
the repeats (the minimum: each run is a whole process on a shared machine).

Usage: python bench/bench_sd_product.py [--width-mult 0.5 0.1] [--repeats 3] [--fit 6400]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_sd_skip import PROBS, train_macs
from fathom.models.ciresan import CiresanMLP


def expected_saving(width_mult: float) -> float:
    """The schedule's expected share of training MACs (one formula: ``bench_sd_skip``)."""
    model = CiresanMLP(recipe="sd_constant", width_mult=width_mult)
    dense = train_macs(model)
    layers = model.affine_layers()[1:-1]
    return (
        sum(p * 3 * m.in_features * m.out_features for p, m in zip(PROBS, layers, strict=True))
        / dense
    )


def train_once(
    recipe: str, width_mult: float, fit: int, epochs: int, runs: Path, tag: str
) -> float:
    sets = {
        "model.recipe": recipe,
        "model.width_mult": width_mult,
        "optim.lr": 0.01,
        "optim.epochs": epochs,
        "data.fit_subset": fit,
        "data.eval_subset": 1000,
        "telemetry.enabled": "false",
        "eval.every": epochs,
        "device": "cpu",
    }
    args = [sys.executable, "-m", "fathom.cli", "train", "--quiet", "--runs-dir", str(runs)]
    args += ["--name", tag]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(args, check=True, env=env, stdout=subprocess.DEVNULL)
    manifest = next(runs.glob(f"*/{tag}/manifest.json"))
    return float(json.loads(manifest.read_text())["clocks"]["training_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width-mult", type=float, nargs="+", default=[0.5, 0.1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fit", type=int, default=6400)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} cpus; one thread")
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.width_mult:
            clocks: dict[str, list[float]] = {"residual": [], "sd_constant": []}
            for r in range(args.repeats):
                for recipe in clocks:
                    tag = f"{recipe}-w{w}-r{r}"
                    clocks[recipe].append(
                        train_once(recipe, w, args.fit, args.epochs, Path(tmp), tag)
                    )
            t_res, t_sd = min(clocks["residual"]), min(clocks["sd_constant"])
            exp = expected_saving(w)
            real = 1 - t_sd / t_res
            print(
                f"width x {w}: training clock residual {t_res:.2f} s, sd_constant {t_sd:.2f} s "
                f"(min of {args.repeats}; all: {[round(t, 2) for t in clocks['residual']]} / "
                f"{[round(t, 2) for t in clocks['sd_constant']]}); expected saving {exp:.2%}, "
                f"realized {real:+.2%}, realized/expected {real / exp:.2f}"
            )


if __name__ == "__main__":
    main()
