"""Telemetry cost: per-example moments vs one training step vs BackPACK, and run overhead.

Part 1 (same model, same batch of ``--batch`` examples, timings interleaved over repeats):

* step:     one SGD training step (forward, backward, momentum update) on the batch;
* moments:  ``Recorder.observe`` with family ``moments`` on the batch as the probe (dense
            forward with hooks, ``autograd.grad`` to the affine outputs, N x N Gram matrices,
            every moment of every affine layer in float64);
* BackPACK: forward + backward under ``backpack(BatchL2Grad(), SumGradSquared(), Variance())``
            (per-example squared norms, sum of squared gradients, gradient variance);
* gradient: forward + backward of the mean cross entropy (no update);
* observe:  ``Instruments(model, x, y).observe(optimizer=opt)`` with the default families
            (all but ``scores``: probe, activations, backprop, gradients, moments, params),
            after nudging the first weight in place (as between epochs: every layer past the
            first sees new inputs; the nudge is timed with the observation).

Reported as median seconds (this thread's CPU clock, ``time.thread_time``) and ratios to the
step. BackPACK's per-example squared norms
are checked against the moments (``B * sum_i batch_l2_i == mean_i ||g_i||^2`` per layer).
Then the order statistics of the quantile fields at this model's activation sizes: numpy's
full sort against the counting route the summaries take (each result checked equal).

Part 2 (``--overhead``): the quick study's run config (``presets/ciresan-sd-quick.toml``,
recipe ``--recipe``, real MNIST) trained with telemetry off and on through
``fathom.train.qualify`` (all families, default schedule): overhead = telemetry clock /
training clock, cold first observation separately, plus each family's median cost alone.

Usage: python bench/bench_telemetry.py [--width-mult 0.1] [--batch 128] [--repeats 7] [--overhead]
BackPACK is a dev-only dependency (``pip install --no-deps backpack-for-pytorch einops unfoldNd``).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import tempfile
import time
import tomllib
import warnings
from importlib import resources
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from fathom import Instruments
from fathom.config import RunConfig, TelemetryConfig, validate_run_config
from fathom.depth import dense_eval
from fathom.models.ciresan import CiresanMLP
from fathom.telemetry import FAMILIES, Recorder, schedule_due

CLOCK = time.thread_time  # this thread's CPU time: other jobs on the machine do not enter


def machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )


def _ctx(model, splits, opt):
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return SimpleNamespace(
        epoch=1, step=1, model=model, optimizer=opt, controller=None, splits=splits, lr=None,
        initial_params=init, device=torch.device("cpu"), config=RunConfig(),
    )  # fmt: skip


def part1(width_mult: float, batch: int, repeats: int, iters: int) -> None:
    from backpack import backpack, extend
    from backpack.extensions import BatchL2Grad, SumGradSquared, Variance

    warnings.filterwarnings("ignore", module="backpack")
    warnings.filterwarnings("ignore", message="Full backward hook")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, 784), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (batch,), generator=g)
    torch.manual_seed(0)
    base = CiresanMLP(width_mult=width_mult, recipe="residual")
    m_step, m_tel = copy.deepcopy(base), copy.deepcopy(base)
    m_bp = extend(copy.deepcopy(base))
    loss_bp = extend(torch.nn.CrossEntropyLoss())
    opt = torch.optim.SGD(m_step.parameters(), lr=1e-3, momentum=0.9)
    splits = SimpleNamespace(fit_x=x, fit_y=y, val_x=x[:0], val_y=y[:0], test_x=x[:0], test_y=y[:0])
    tel_opt = torch.optim.SGD(m_tel.parameters(), lr=1e-3, momentum=0.9)
    rec = Recorder(
        TelemetryConfig(probe_size=batch, families=("moments",)),
        epochs=2,
        splits=splits,
        model=m_tel,
        seed=0,
    )
    ctx = _ctx(m_tel, splits, tel_opt)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m_step(x), y).backward()
        opt.step()

    m_obs = copy.deepcopy(base)
    obs_opt = torch.optim.SGD(m_obs.parameters(), lr=1e-3, momentum=0.9)
    F.cross_entropy(m_obs(x), y).backward()
    obs_opt.step()  # a momentum buffer, so that every params field is defined
    ins = Instruments(m_obs, x, y)  # the default families (all but scores)

    def gradient() -> None:
        m_obs.zero_grad(set_to_none=True)
        F.cross_entropy(m_obs(x), y).backward()

    first = next(m_obs.parameters())

    def observe() -> None:
        # as between two epochs: the weights moved, so no layer but the first (whose input
        # is the probe itself) sees the inputs of the last observation (a one-op nudge of
        # the first weight, timed with it)
        with torch.no_grad():
            first.add_(1e-4)
        ins.observe(optimizer=obs_opt)

    tel_first = next(m_tel.parameters())

    def moments() -> None:
        with torch.no_grad():
            tel_first.add_(1e-4)  # as between epochs (see ``observe`` below)
        rec.observe(ctx)

    def bp() -> None:
        m_bp.zero_grad(set_to_none=True)
        with backpack(BatchL2Grad(), SumGradSquared(), Variance()):
            loss_bp(m_bp(x), y).backward()

    # Consistency: BackPACK's per-example norms of the mean loss are (1/B) of ours.
    bp()
    row = rec.observe(ctx)
    modules = dict(m_bp.named_modules())
    for layer in rec.instruments.layers:
        ours = row[f"grad/pex/mean_sq_norm/{layer.name}"]
        theirs = float(modules[layer.name].weight.batch_l2.double().sum()) * batch
        assert abs(ours - theirs) <= 1e-3 * abs(ours) + 1e-12, (layer.name, ours, theirs)

    variants = {
        "step": step,
        "moments": moments,
        "backpack": bp,
        "gradient": gradient,
        "observe (default families)": observe,
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in variants.items():
            t0 = CLOCK()
            for _ in range(iters):
                fn()
            times[name].append((CLOCK() - t0) / iters)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n## Part 1: per-example moments vs a training step vs BackPACK (batch {batch})")
    print(
        f"model: CiresanMLP residual, widths {base.widths}, {sum(p.numel() for p in base.parameters()):,} parameters"
    )
    print(f"repeats {repeats} x {iters} iterations, interleaved; median seconds per call")
    print("| variant | median s | x step |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.5f} | {v / med['step']:.2f} |")
    print(f"moments / BackPACK = {med['moments'] / med['backpack']:.2f}")
    print(
        "observe (default families) / gradient (forward + backward of the mean CE) = "
        f"{med['observe (default families)'] / med['gradient']:.2f} (goal <= 4)"
    )
    print("consistency: BackPACK batch_l2 * B matches mean ||g_i||^2 on every layer (rel 1e-3)")
    order_statistics(base, batch, repeats, iters)


def order_statistics(model: CiresanMLP, batch: int, repeats: int, iters: int) -> None:
    """The quantile fields' order statistics on arrays of this model's activation sizes: numpy's
    full sort against the counting route (``fathom.telemetry.distributions._select``), each on
    normal draws, ReLU outputs, and backpropagated signals (normal with ReLU's zeros)."""
    import numpy as np

    from fathom.telemetry.distributions import _quantile_ranks, _select
    from fathom.telemetry.field import QUANTILES

    g = np.random.default_rng(0)
    print(f"\norder statistics (the ranks of the quantile fields), median of {repeats} x {iters}:")
    print("| entries | values | np.sort s | counting route s | route / sort |")
    print("|---|---|---|---|---|")
    for n in sorted({batch * w for w in model.widths}, reverse=True):
        z = g.standard_normal(n).astype(np.float32)
        mask = g.standard_normal(n) > 0
        for label, x in (("normal", z), ("ReLU", np.maximum(z, 0)), ("backprop", z * mask)):
            ranks = _quantile_ranks(n, QUANTILES)
            assert _select(x, ranks)[0] == np.sort(x)[ranks].tolist()
            t = {"sort": [], "route": []}
            for _ in range(repeats):
                for name, fn in (("sort", np.sort), ("route", lambda a, r=ranks: _select(a, r))):
                    t0 = CLOCK()
                    for _ in range(iters):
                        fn(x)
                    t[name].append((CLOCK() - t0) / iters)
            a, b = statistics.median(t["sort"]), statistics.median(t["route"])
            print(f"| {n:,} | {label} | {a:.6f} | {b:.6f} | {b / a:.2f} |")


def quick_config(recipe: str) -> RunConfig:
    text = resources.files("fathom").joinpath("presets/ciresan-sd-quick.toml").read_text()
    data = tomllib.loads(text)
    run = {k: v for k, v in data["base"].items()}
    run.update(name=f"bench-{recipe}", study="bench", device="cpu", seed=101)
    run["model"] = {**run.get("model", {}), "recipe": recipe}
    run["optim"] = {**run.get("optim", {}), "lr": 0.03}
    run["telemetry"] = {"enabled": False}
    return validate_run_config(run, origin="ciresan-sd-quick base")


def part2(recipe: str, repeats: int) -> None:
    from fathom.train.loop import prepare_splits
    from fathom.train.qualify import qualify

    cfg = quick_config(recipe)
    splits = prepare_splits(cfg, torch.device("cpu"))
    due = [
        e
        for e in range(cfg.optim.epochs + 1)
        if schedule_due(e, cfg.telemetry.first, cfg.telemetry.every, cfg.optim.epochs)
    ]
    print(f"\n## Part 2: overhead on the quick study's run config (recipe {recipe})")
    print(
        f"fit {splits.fit_y.shape[0]}, val {splits.val_y.shape[0]}, test {splits.test_y.shape[0]}; "
        f"widths x {cfg.model.width_mult}; {cfg.optim.epochs} epochs, batch {cfg.optim.batch_size}; "
        f"probe {cfg.telemetry.probe_size}; telemetry due at epochs {due}"
    )
    print(
        "| families | byte-identical | history identical | training s | telemetry s | cold s | overhead incl. cold | without cold |"
    )
    print("|---|---|---|---|---|---|---|---|")
    no_scores = [f for f in FAMILIES if f != "scores"]
    for label, fams in (("all", ["all"]), ("all but scores", no_scores), ("cheap", ["cheap"])):
        run_cfg = cfg.with_updates({"telemetry.families": fams})
        with tempfile.TemporaryDirectory() as tmp:
            q = qualify(run_cfg, tmp, splits=splits)
        print(
            f"| {label} | {q.params_identical} | {not q.history_mismatches} | {q.training_s:.2f} | "
            f"{q.telemetry_s:.3f} | {q.telemetry_cold_s:.3f} | {100 * q.overhead:.2f}% | "
            f"{100 * q.overhead_without_cold:.2f}% |"
        )
    epoch_s = q.training_s / cfg.optim.epochs  # the cheap run's training clock

    torch.manual_seed(0)
    model = CiresanMLP(width_mult=cfg.model.width_mult, recipe=recipe)
    opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    F.cross_entropy(model(splits.fit_x[:64]), splits.fit_y[:64]).backward()
    opt.step()
    ctx = _ctx(model, splits, opt)
    ctx.config = cfg
    print(
        f"\nper-family cost of one observation (median of {repeats}), relative to one training epoch ({epoch_s:.2f} s)"
    )
    print("| family | median s | % of an epoch |")
    print("|---|---|---|")
    for fam in FAMILIES:
        rec = Recorder(
            TelemetryConfig(families=(fam,)),
            epochs=cfg.optim.epochs,
            splits=splits,
            model=model,
            seed=0,
        )
        rec.observe(ctx)
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            rec.observe(ctx)
            ts.append(time.perf_counter() - t0)
        med = statistics.median(ts)
        print(f"| {fam} | {med:.4f} | {100 * med / epoch_s:.2f} |")
    rec = Recorder(
        TelemetryConfig(families=("scores",)),
        epochs=cfg.optim.epochs,
        splits=splits,
        model=model,
        seed=0,
    )
    with torch.no_grad(), dense_eval(model):
        preds = {s: model(getattr(splits, f"{s}_x")).argmax(1) for s in rec.split_names}
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rec.observe(ctx, predictions=preds)
        ts.append(time.perf_counter() - t0)
    med = statistics.median(ts)
    print(f"| scores, from the caller's predictions | {med:.4f} | {100 * med / epoch_s:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width-mult", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--overhead", action="store_true", help="also run Part 2 (needs MNIST)")
    p.add_argument("--recipe", default="sd_constant")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# bench_telemetry on {machine()} (shared development machine; load varies)")
    part1(args.width_mult, args.batch, args.repeats, args.iters)
    if args.overhead:
        part2(args.recipe, args.repeats)


if __name__ == "__main__":
    main()
