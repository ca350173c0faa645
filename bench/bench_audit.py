"""Layer-removal audit: wall time on one quick-study-sized run, reduced-network speedups.

Usage: ``python bench/bench_audit.py [RUN_DIR] [--repeats 7]``. Without ``RUN_DIR`` it
trains one run at the quick-study scale itself (``ciresan-sd-quick``: widths x 0.1, 10,000
fitting and 5,000 validation/test MNIST examples, 5 epochs, recipe sd_constant, seed 101)
into a temporary directory, and says so. Then it times ``fathom audit`` on it (both
checkpoints, router on) and measures, side by side in one process with the masks
interleaved in random order, the median forward time of every fixed mask against the
dense network at batch sizes 1 and 256, for the quick-study widths and the full widths
(784-2500-2000-1500-1000-500-10, untrained weights: time does not depend on values).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from fathom.audit.checkpoint import AuditSettings
from fathom.audit.costs import mask_macs
from fathom.audit.masks import enumerate_masks, mask_label
from fathom.audit.run import audit_runs
from fathom.audit.speed import time_masks
from fathom.config import RunConfig
from fathom.models.ciresan import CiresanMLP
from fathom.train.loop import train


def quick_run(root: Path) -> Path:
    cfg = RunConfig.model_validate(
        {
            "name": "sd_constant-101",
            "study": "bench-audit",
            "seed": 101,
            "device": "cpu",
            "data": {"fit_subset": 10000, "eval_subset": 5000},
            "model": {"recipe": "sd_constant", "width_mult": 0.1},
            "optim": {"epochs": 5, "batch_size": 64, "lr": 0.01},
            "eval": {"every": 1, "first": [1]},
            "checkpoints": {"save_epochs": [0, 5]},
        }
    )
    run = root / "sd_constant-101"
    t0 = time.perf_counter()
    train(cfg, run)
    print(f"trained a quick-study-sized run myself in {time.perf_counter() - t0:.1f} s: {run}")
    return run


def speed_table(widths_mult: float, repeats: int) -> None:
    torch.manual_seed(0)
    model = CiresanMLP(recipe="sd_constant", width_mult=widths_mult).eval()
    masks = enumerate_masks(4)
    x = torch.randint(0, 256, (256, 784), dtype=torch.uint8)
    macs = mask_macs(model, masks, x)
    print(f"\nwidths {model.widths} (float32, CPU, {torch.get_num_threads()} threads)")
    results = {b: time_masks(model, x[:b], masks, 15, repeats=repeats) for b in (1, 256)}
    print("mask  MAC-frac  " + "  ".join(f"b={b}: ms  speedup" for b in results))
    for m, row in enumerate(masks):
        cells = [f"{1e3 * r.seconds[m]:9.3f}  {r.speedups()[m]:6.2f}x" for r in results.values()]
        print(f"{mask_label(row)}  {macs[m] / macs[15]:8.3f}  " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--speed-only", action="store_true", help="skip the audit wall time")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
        f"(shared with other jobs), torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        if args.speed_only:
            for mult in (0.1, 1.0):
                speed_table(mult, args.repeats)
            return
        run = Path(args.run_dir) if args.run_dir else quick_run(Path(tmp))
        settings = AuditSettings(checkpoints=("selected", "final"), timing_repeats=args.repeats)
        t0 = time.perf_counter()
        result = audit_runs(run, settings, Path(tmp) / "audit")
        wall = time.perf_counter() - t0
        rec = result["runs"][0]["checkpoints"]["selected"]
        print(
            f"audit wall time (2 checkpoints x 16 masks x val+test 5,000 each, router, "
            f"mask timing at batch 1 and 256 x {args.repeats} repeats): {wall:.1f} s"
        )
        r = rec["routing"]
        print(
            f"selected: dense test acc {rec['masks'][-1]['test']['acc']:.4f}; router: "
            f"{r['control']['verdict']}; routed/dense time {r['timing']['routed_over_dense']:.2f}"
        )
    for mult in (0.1, 1.0):
        speed_table(mult, args.repeats)


if __name__ == "__main__":
    main()
