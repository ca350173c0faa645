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

``--concurrent`` runs each repeat's two processes at the same time, one per CPU, the CPUs
swapped every other repeat: both see the same moments of a drifting host, which back-to-back
runs do not. An epoch counts only while the other run is still training through all of it
(``clock/unix_s``, each row's own timestamp, bounds it); the expected saving is taken over the
sd_constant run's counted epochs.

``--huang`` adds a third run per repeat, ``sd_huang``: ``sd_constant`` with
``depth.convention = "huang"`` (kept branches unscaled: no gain multiply), the same seed and
so the same drawn gates, in the same rotation (not with ``--concurrent``); its realized /
expected saving is printed beside the inverse-survival one's.

Usage: python bench/bench_sd_product.py [--width-mult 0.5 0.1] [--repeats 3] [--fit 6400]
                                        [--epochs 6] [--cpu N] [--concurrent] [--huang]
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
ARMS = {"residual": {}, "sd_constant": {}, "sd_huang": {"depth.convention": "huang"}}
"""Each timed arm's config beside its recipe (``sd_huang`` trains ``sd_constant``)."""


def train_once(
    recipe: str, width_mult: float, args: argparse.Namespace, runs: Path, tag: str
) -> Path:
    """One pinned ``fathom train`` process; returns its run directory."""
    finish(start(recipe, width_mult, args, runs, tag, args.cpu))
    return run_dir_of(runs, tag)


def run_dir_of(runs: Path, tag: str) -> Path:
    return next(runs.glob(f"*/{tag}/manifest.json")).parent


def start(
    recipe: str, width_mult: float, args: argparse.Namespace, runs: Path, tag: str, cpu: int
) -> subprocess.Popen:
    """A ``fathom train`` process pinned to ``cpu``, started (:func:`finish` waits for it)."""
    sets = {
        **ARMS[recipe],
        "model.recipe": "sd_constant" if recipe == "sd_huang" else recipe,
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
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.sched_setaffinity(0, {cpu})
    )


def finish(proc: subprocess.Popen) -> None:
    """Wait for a process from :func:`start`; a failed run ends the benchmark."""
    if (rc := proc.wait()) != 0:
        raise SystemExit(f"{' '.join(map(str, proc.args))} exited {rc}")


def concurrent_pair(
    width_mult: float, args: argparse.Namespace, runs: Path, r: int
) -> dict[str, Path]:
    """Both recipes at once, residual on one CPU and sd_constant on the other (swapped on odd
    repeats)."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        raise SystemExit("--concurrent needs two CPUs")
    if r % 2:
        cpus.reverse()
    tags = {recipe: f"{recipe}-w{width_mult}-r{r}" for recipe in RECIPES}
    procs = [
        start(recipe, width_mult, args, runs, tags[recipe], cpu)
        for recipe, cpu in zip(RECIPES, cpus, strict=True)
    ]
    for proc in procs:
        finish(proc)
    return {recipe: run_dir_of(runs, tag) for recipe, tag in tags.items()}


def epoch_windows(run_dir: Path) -> dict[int, tuple[float, float]]:
    """Epoch ``e`` -> (unix time of row ``e - 1``, of row ``e``): it trained inside that window."""
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    stamp = {r["epoch"]: r["clock/unix_s"] for r in rows}
    return {e: (stamp[e - 1], stamp[e]) for e in sorted(stamp) if e - 1 in stamp}


def overlapped_epochs(run: Path, other: Path, first_epoch: int) -> list[int]:
    """``run``'s epochs from ``first_epoch`` on that lie wholly inside ``other``'s training
    from its own ``first_epoch`` to its last epoch."""
    mine, theirs = epoch_windows(run), epoch_windows(other)
    lo = theirs[first_epoch][0] if first_epoch in theirs else min(a for a, _ in theirs.values())
    hi = max(b for _, b in theirs.values())
    return [e for e, (a, b) in mine.items() if e >= first_epoch and a >= lo and b <= hi]


CLOCKS = {"cpu": "clock/training_cpu_s", "wall": "clock/training_s"}


def epoch_clocks(run_dir: Path, field: str = CLOCKS["cpu"]) -> list[float]:
    """Training-clock seconds of epochs 1..E (differences of the cumulative history clock)."""
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    cum = {r["epoch"]: r[field] for r in rows if field in r}
    epochs = sorted(cum)
    return [cum[b] - cum[a] for a, b in itertools.pairwise(epochs)]


def drawn_saving(run_dir: Path, first_epoch: int, epochs: set[int] | None = None) -> float:
    """The dropped share of training MACs over epochs ``first_epoch..E`` (or over ``epochs``),
    from the replayed gates.

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
        if epoch >= first_epoch and (epochs is None or epoch in epochs):
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
    ap.add_argument(
        "--concurrent", action="store_true", help="each repeat's two runs at once, one per CPU"
    )
    ap.add_argument("--huang", action="store_true", help="also time sd_constant under huang")
    args = ap.parse_args()
    arms = (*RECIPES, "sd_huang") if args.huang and not args.concurrent else RECIPES
    args.cpu = args.cpu if args.cpu >= 0 else max(os.sched_getaffinity(0))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    where = "two cpus at once" if args.concurrent else f"cpu {args.cpu}"
    print(f"load average at start: {load}; {os.cpu_count()} cpus; one thread per run, {where}")
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.width_mult:
            per_run = {c: {arm: [] for arm in arms} for c in CLOCKS}
            expected = []
            for r in range(args.repeats):
                if args.concurrent:
                    runs = concurrent_pair(w, args, Path(tmp), r)
                    counted = {
                        recipe: overlapped_epochs(runs[recipe], runs[other], first_epoch=2)
                        for recipe, other in zip(RECIPES, RECIPES[::-1], strict=True)
                    }
                    if not all(counted.values()):  # one run trained wholly before the other
                        print(f"  repeat {r}: no epoch overlapped the other run; left out")
                        continue
                    for clock, field in CLOCKS.items():
                        for recipe, run in runs.items():
                            clocks = dict(enumerate(epoch_clocks(run, field), start=1))
                            per_run[clock][recipe].append(
                                statistics.median(clocks[e] for e in counted[recipe])
                            )
                    expected.append(
                        drawn_saving(runs["sd_constant"], 2, set(counted["sd_constant"]))
                    )
                    continue
                for recipe in arms[r % len(arms) :] + arms[: r % len(arms)]:  # rotating
                    run = train_once(recipe, w, args, Path(tmp), f"{recipe}-w{w}-r{r}")
                    for clock, field in CLOCKS.items():
                        per_run[clock][recipe].append(
                            statistics.median(epoch_clocks(run, field)[1:])
                        )
                    if recipe == "sd_constant":
                        expected.append(drawn_saving(run, first_epoch=2))
            exp = statistics.mean(expected)
            print(f"width x {w}: expected saving (drawn gates) {exp:.2%}")
            epochs = (
                "epochs overlapping the other run"
                if args.concurrent
                else f"epochs 2..{args.epochs}"
            )
            for clock in CLOCKS:
                for arm in arms[1:]:
                    report(clock, per_run[clock], exp, epochs, arm)
            print(f"  (load now {os.getloadavg()[0]:.2f})")


def report(
    clock: str, per_run: dict[str, list[float]], exp: float, epochs: str, arm: str = "sd_constant"
) -> None:
    """One clock's line: per-run epoch medians, the arms' medians, realized / expected of
    ``arm`` against ``residual``."""
    t_res = statistics.median(per_run["residual"])
    t_sd = statistics.median(per_run[arm])
    real = 1 - t_sd / t_res
    fmt = lambda v: ", ".join(f"{t:.3f}" for t in v)  # noqa: E731
    # each repeat's two runs ran back to back: their ratio is one paired sample, and the
    # spread of those samples is what this figure can resolve (runs of one recipe vary by
    # several percent of an epoch from process to process on a shared host)
    pairs = [
        (1 - sd / res) / exp for res, sd in zip(per_run["residual"], per_run[arm], strict=True)
    ]
    print(
        f"  {clock:4} clock, s per epoch (median of {epochs}): residual "
        f"[{fmt(per_run['residual'])}], {arm} [{fmt(per_run[arm])}]; "
        f"medians {t_res:.3f} / {t_sd:.3f}; realized {real:+.2%}, "
        f"realized/expected {real / exp:.2f} (per repeat: {', '.join(f'{x:.2f}' for x in pairs)})"
    )
    if len(pairs) >= 3:
        from scipy import stats

        mean, sem = statistics.fmean(pairs), stats.sem(pairs)
        lo, hi = stats.t.interval(0.95, len(pairs) - 1, loc=mean, scale=sem)
        print(
            f"  {clock:4} clock, {arm} paired realized/expected: mean {mean:.2f}, 95% t-interval "
            f"[{lo:.2f}, {hi:.2f}] over {len(pairs)} repeats"
        )


if __name__ == "__main__":
    main()
