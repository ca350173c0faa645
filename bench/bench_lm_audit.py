"""The language model's layer-removal audit: cost per mask on the gpt-quick model.

Usage: ``python bench/bench_lm_audit.py [RUN_DIR] [--repeats 3] [--eval-windows N]``.
With ``RUN_DIR`` (a trained gpt run, e.g. ``fathom train gpt-quick``) its selected
weights are used; without one, the gpt-quick model untrained (the cost of a mask does not
depend on the weights' values). Data: Moby Dick's validation and test windows at context 64
(``fathom data fetch moby-dick``), the first ``--eval-windows`` of each (default all).

Measured side by side in one process, each repeat visiting the masks in a fresh random
order, medians over ``--repeats``:

* **one mask's pass** (:meth:`fathom.audit.tokens.MaskEvaluator.evaluate`: validation and
  test, float64 token CE per window) for masks keeping 4, 3, 2, 1 and 0 blocks;
* **a plain loop's pass** over the same windows (``F.cross_entropy`` on ``model(x)``, no
  mask machinery), the reference the full mask's pass is divided by (the audit's overhead);
* **the FLOP count of one mask** (:func:`fathom.audit.costs.mask_costs` on one window);
* the whole ``lm_audit_checkpoint`` (16 masks, greedy path, judgments) once.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fathom.audit.costs import mask_costs
from fathom.audit.lm import lm_audit_checkpoint
from fathom.audit.masks import mask_label
from fathom.audit.tokens import MaskEvaluator
from fathom.data.prepare import prepare_splits
from fathom.models import build_model
from fathom.rundir import RunDir
from fathom.study.family import load_run_config_or_preset


def _model_and_splits(run: str | None, windows: int | None):
    if run is not None:
        rd = RunDir(Path(run))
        model, splits, what = rd.load_model("selected"), rd.load_splits("cpu"), f"run {run}"
    else:
        cfg = load_run_config_or_preset("gpt-quick")
        splits = prepare_splits(cfg.data, "cpu")
        torch.manual_seed(0)
        shape = (cfg.data.context,)
        model = build_model(cfg.model, classes=splits.info["classes"], input_shape=shape)
        what = "gpt-quick, untrained"
    model = model.float().eval()
    sl = slice(None) if windows is None else slice(0, windows)
    data = {
        n: (getattr(splits, f"{n}_x")[sl], getattr(splits, f"{n}_y")[sl]) for n in ("val", "test")
    }
    return model, data, what


@torch.no_grad()
def plain_pass(model, data, batch: int) -> None:
    for x, y in data.values():
        for s in range(0, x.shape[0], batch):
            z = model(x[s : s + batch])
            F.cross_entropy(z.reshape(-1, z.shape[-1]), y[s : s + batch].reshape(-1)).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", nargs="?", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eval-windows", type=int, default=None)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    model, data, what = _model_and_splits(args.run, args.eval_windows)
    layers = len(model.blocks) if hasattr(model, "blocks") else len(model.net.blocks)
    tokens = sum(int(y.numel()) for _, y in data.values())
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()} "
        f"threads={torch.get_num_threads()} torch={torch.__version__}; shared with other "
        f"agents (load {os.getloadavg()[0]:.1f})"
    )
    print(f"model: {what}, {layers} blocks; val+test {tokens} tokens; repeats {args.repeats}")
    masks = [tuple([1] * keep + [0] * (layers - keep)) for keep in range(layers, -1, -1)]
    times: dict[str, list[float]] = {mask_label(m): [] for m in masks} | {"plain": []}
    flops_t: dict[str, list[float]] = {mask_label(m): [] for m in masks}
    rng = random.Random(0)
    for _ in range(args.repeats):
        order = [*masks, "plain"]
        rng.shuffle(order)
        for m in order:
            t0 = time.perf_counter()
            if m == "plain":
                plain_pass(model, data, args.batch)
                times["plain"].append(time.perf_counter() - t0)
                continue
            MaskEvaluator(model, data, args.batch).evaluate(m)
            times[mask_label(m)].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            mask_costs(model, data["val"][0][:1], np.array([m]))
            flops_t[mask_label(m)].append(time.perf_counter() - t0)
    plain = statistics.median(times["plain"])
    print(f"plain loop pass (val+test): median {plain:.3f} s")
    print("| mask | kept | pass (val+test) s, median | pass / plain | FLOP count s, median |")
    print("|---|---:|---:|---:|---:|")
    for m in masks:
        lab = mask_label(m)
        med = statistics.median(times[lab])
        print(
            f"| `{lab}` | {sum(m)} | {med:.3f} | {med / plain:.3f} | {statistics.median(flops_t[lab]):.4f} |"
        )

    class S:
        val_x, val_y = data["val"]
        test_x, test_y = data["test"]

    t0 = time.perf_counter()
    rec = lm_audit_checkpoint(model, S, max_masks=64, batch_size=args.batch)
    wall = time.perf_counter() - t0
    n = rec["coverage"]["masks_evaluated"]
    print(
        f"whole audit: {n} masks in {wall:.1f} s ({wall / n:.3f} s per mask, FLOPs and judgments included)"
    )
    for s in rec["sentences"]:
        print(f"- {s}")


if __name__ == "__main__":
    main()
