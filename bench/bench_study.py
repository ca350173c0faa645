"""Benchmark studies: the quick preset with 1 vs 2 local workers, and Ray's per-run overhead.

    .venv/bin/python bench/bench_study.py [--skip-quick] [--repeats 3]

1. ``ciresan-sd-quick`` (real MNIST, 30 runs) end to end with ``--workers 1`` and
   ``--workers 2``, each into a fresh directory, one after the other: wall time and ratio.
2. Ray overhead: a tiny study (4 runs, 1 epoch, width x 0.02, 500 fitting examples) run
   sequentially in this process and as Ray tasks on a one-CPU local Ray (so the tasks
   also run one at a time and the difference is overhead, not parallelism); per-run overhead
   = (Ray wall - local wall) / runs, with Ray start-up timed separately. Repeated
   ``--repeats`` times; medians printed. Final hashes must agree.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import torch

from fathom.study.backends import LocalBackend, RayBackend
from fathom.study.config import load_study, validate_study_config
from fathom.study.runner import run_study

TINY = {
    "study": {
        "name": "bench-ray",
        "reference": "residual",
        "recipes": ["residual", "sd_constant"],
        "seeds": [101, 102],
        "lr": 0.01,
    },
    "tuning": {"enabled": False},
    "base": {
        "device": "cpu",
        "data": {"fit_subset": 500, "eval_subset": 500},
        "model": {"width_mult": 0.02},
        "optim": {"epochs": 1},
        "checkpoints": {"save_epochs": [0, 1]},
    },
}


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"1-min load average at start {load:.1f} (shared machine)"
    )


def hashes(result) -> dict[str, str]:
    return {k: v["final_params"] for k, v in result.summary["runs"].items()}


def bench_quick() -> None:
    study, _ = load_study("ciresan-sd-quick")
    walls, results = {}, {}
    for workers in (1, 2):
        with tempfile.TemporaryDirectory(prefix="fathom-bench-") as d:
            t0 = time.perf_counter()
            results[workers] = hashes(run_study(study, d, LocalBackend(workers=workers, threads=1)))
            walls[workers] = time.perf_counter() - t0
        print(f"quick study, {workers} worker(s): {walls[workers]:.1f} s wall (30 runs)")
    print(f"ratio wall(1 worker) / wall(2 workers) = {walls[1] / walls[2]:.2f}")
    print(f"final hashes equal across worker counts: {results[1] == results[2]}")


def bench_ray(repeats: int) -> None:
    import ray

    study = validate_study_config(TINY, "bench")
    n = len(study.study.recipes) * len(study.study.seeds)
    t0 = time.perf_counter()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)  # serial tasks, like local
    startup = time.perf_counter() - t0
    local_w, ray_w, same = [], [], []
    try:
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
                t0 = time.perf_counter()
                h_local = hashes(run_study(study, a, LocalBackend(1, 1)))
                local_w.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                h_ray = hashes(run_study(study, b, RayBackend(None, 1)))
                ray_w.append(time.perf_counter() - t0)
                same.append(h_local == h_ray)
    finally:
        ray.shutdown()
    ml, mr = statistics.median(local_w), statistics.median(ray_w)
    print(f"ray start-up (ray.init, local cluster): {startup:.1f} s")
    print(
        f"tiny study ({n} runs), median of {repeats}: local {ml:.2f} s, ray {mr:.2f} s, ratio {mr / ml:.2f}"
    )
    print(
        f"ray per-run overhead: {(mr - ml) / n:.2f} s per run; hashes equal in every repeat: {all(same)}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip-quick", action="store_true")
    p.add_argument("--skip-ray", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(f"machine: {machine()}")
    if not args.skip_ray:
        bench_ray(args.repeats)
    if not args.skip_quick:
        bench_quick()


if __name__ == "__main__":
    main()
