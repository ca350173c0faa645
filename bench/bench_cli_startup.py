"""CLI latency: CPU and wall time of every subcommand path, for two source trees, interleaved.

Usage: ``python bench/bench_cli_startup.py --before OLD/src [--repeats 5]`` (OLD: e.g.
``git archive main src | tar -x -C OLD``, the tree to compare with). Each path of
:data:`PATHS` (helps, config validation of every kind, presets, data info/verify, study
status, the run registry, telemetry docs, and the error paths a typo takes before anything
is computed, and every error met before any work: a run name taken, ``--workers 0``, an
``--out`` that is a file, a missing ``.npz``, ``--resume`` of a complete run, ``--device
cuda`` without one, ...) runs as ``fathom <argv>`` in a fresh interpreter with ``PYTHONPATH`` set to each
tree, the two trees alternating so load changes hit both alike. Per path and tree it prints
the median CPU time (user + sys of the child, ``os.wait4``) and wall time over the repeats,
the exit status and whether torch was imported. The first run of each is discarded (cold
file-system cache, and it writes the byte-code cache).

Byte code is cached as an installed package has it: the children run without
``PYTHONDONTWRITEBYTECODE`` and with ``PYTHONPYCACHEPREFIX`` set to ``--pycache`` (default
``/tmp/fathom-bench-pycache``), so no ``__pycache__`` lands in the trees. Inheriting
``PYTHONDONTWRITEBYTECODE=1`` (set on the development machines) recompiles every Fathom
module on every call: ≈ 0.05 s of CPU a user never pays.

``study status`` and ``runs list|show`` need a study: the first invocation trains a tiny one
(real MNIST, 256 examples, width x 0.02, one epoch; about half a minute) into ``--fixture``
(default ``/tmp/fathom-bench-cli``) with the ``--after`` tree and reuses it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

STUDY = """
[study]
name = "bench"
reference = "residual"
recipes = ["residual", "sd_constant"]
seeds = [101]
lr = 0.05

[tuning]
enabled = false

[base]
device = "cpu"
data = { fit_subset = 256, eval_subset = 256 }
model = { width_mult = 0.02 }
optim = { epochs = 1 }
"""
"""The tiny study behind ``study status`` and ``runs list|show``."""

RUN = "[optim]\nlr = 0.05\nepochs = 2\n\n[model]\nwidth_mult = 0.1\n"
BAD = "[optim]\nlrr = 0.05\n"

PATHS: tuple[tuple[str, ...], ...] = (
    ("--help",),
    ("train", "--help"),
    ("study", "run", "--help"),
    ("validate", "ciresan-fast"),
    ("validate", "ciresan-sd-quick"),
    ("validate", "quick"),
    ("validate", "{fx}/run.toml"),
    ("validate", "{fx}/bad.toml"),
    ("validate", "ciresan-fsat"),
    ("train", "ciresan-fsat"),
    ("train", "ciresan-fast", "--set", "optim.lrr=0.1"),
    ("train", "{fx}/bad.toml"),
    ("study", "run", "ciresan-sd-quik"),
    ("depth-scaling", "--preset", "quik"),
    ("trian",),
    ("data", "info", "mnist"),
    ("data", "info"),
    ("data", "verify", "mnist"),
    ("study", "status", "{fx}/runs/bench"),
    ("runs", "list", "--runs-dir", "{fx}/runs"),
    ("runs", "show", "main-residual-s101", "--runs-dir", "{fx}/runs"),
    ("telemetry", "docs", "--out", "{fx}/metrics.md"),
    # errors met before any work (each refused with exit 2, before torch is imported)
    ("train", "--resume", "{run}"),
    ("train", "ciresan-fast", "--runs-dir", "{fx}/runs", "--set", "study=bench", "--name", "{id}"),
    ("train", "ciresan-fast", "--runs-dir", "{fx}/afile"),
    ("train", "ciresan-fast", "--device", "cuda"),
    ("train", "{fx}/npz.toml"),
    ("study", "run", "ciresan-sd-quick", "--workers", "0"),
    ("study", "run", "ciresan-sd-quick", "--runs-dir", "{fx}/afile"),
    ("reproduce", "quick", "--workers", "0"),
    ("depth-scaling", "--preset", "quick", "--workers", "0"),
    ("depth-scaling", "--preset", "quick", "--device", "cuda"),
    ("report", "{run}", "--out", "{fx}/afile"),
    ("report", "{fx}/nowhere"),
    ("audit", "{run}", "--out", "{fx}/afile"),
    ("audit", "{run}", "--device", "cuda"),
    ("audit", "{fx}/nowhere"),
    ("curvature", "{run}", "--out", "{fx}/afile"),
    ("curvature", "{run}", "--device", "cuda"),
    ("diagnose", "head", "--device", "cuda"),
    ("telemetry", "qualify", "ciresan-fast", "--device", "cuda"),
    ("runs", "show", "nosuchrun", "--runs-dir", "{fx}/runs"),
    ("train", "{fx}/configs"),
    ("train", "ciresan-fast", "--set", "optim.schedule=cosine"),
    ("train", "ciresan-fast", "--set", "model.kind=resnet"),
    ("study", "run", "ciresan-fast"),
    ("validate", "seed-003"),
)
"""The command paths timed; ``{fx}`` is the fixture directory, ``{run}`` the fixture study's
complete run ``{id}`` (``--device cuda`` paths are errors on a machine without CUDA only)."""

RUN_ID = "main-residual-s101"

PROBE = (
    "import sys, contextlib, io, json\n"
    "from fathom.cli import main\n"
    "out = io.StringIO()\n"
    "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
    "    try:\n        rc = main(sys.argv[1:])\n    except SystemExit as e:\n        rc = e.code\n"
    "    except Exception as e:  # a traceback: said as its exception's name\n"
    "        rc = type(e).__name__\n"
    "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}))\n"
)
"""Runs ``fathom <argv>`` and prints its exit status (an exception's name for a traceback)
and whether torch was imported."""


def make_fixture(fx: Path, src: str) -> None:
    """The tiny study and the config files of :data:`PATHS`, once."""
    fx.mkdir(parents=True, exist_ok=True)
    (fx / "run.toml").write_text(RUN)
    (fx / "bad.toml").write_text(BAD)
    (fx / "afile").write_text("a file where a directory is expected\n")
    (fx / "configs").mkdir(exist_ok=True)
    (fx / "configs" / "a.toml").write_text(RUN)
    (fx / "npz.toml").write_text(f'[data]\ndataset = "tensors"\npath = "{fx}/missing.npz"\n' + RUN)
    if (fx / "runs" / "registry.sqlite").exists():
        return
    (fx / "study.toml").write_text(STUDY)
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "fathom", "study", "run", str(fx / "study.toml")]
    subprocess.run([*cmd, "--runs-dir", str(fx / "runs"), "--quiet"], env=env, check=True)


PYCACHE = ["/tmp/fathom-bench-pycache"]
"""Where the children cache byte code (``--pycache``)."""


def child_env(src: str) -> dict[str, str]:
    """The environment of a timed child: ``src`` first on the path, one thread, byte code
    cached under :data:`PYCACHE` (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": src, "OMP_NUM_THREADS": "1", "PYTHONPYCACHEPREFIX": PYCACHE[0]}


def once(src: str, argv: list[str]) -> tuple[float, float, dict]:
    """``(cpu_s, wall_s, {"rc", "torch"})`` of one fresh ``fathom <argv>``."""
    env = child_env(src)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE, *argv], env=env, stdout=subprocess.PIPE, text=True
    )
    out = proc.stdout.read() if proc.stdout else ""
    _, _, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime, wall, json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--before", help="source tree to compare with (omit: time --after alone)")
    ap.add_argument("--after", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-warm", action="store_true", help="do not discard a first run")
    ap.add_argument("--fixture", default="/tmp/fathom-bench-cli", type=Path)
    ap.add_argument("--only", nargs="*", help="time only the paths starting with these words")
    ap.add_argument("--pycache", default=PYCACHE[0], help="byte-code cache of the children")
    args = ap.parse_args()
    PYCACHE[0] = args.pycache
    make_fixture(args.fixture, args.after)
    trees = {"after": args.after, **({"before": args.before} if args.before else {})}
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}; repeats {args.repeats}"
        f"{'' if args.no_warm else ' (+1 discarded)'}; "
        f"load average {os.getloadavg()}"
    )
    print(f"{'path':<52} {'tree':<6} {'cpu s':>6} {'wall s':>6}  rc  torch")
    for path in PATHS:
        run = args.fixture / "runs" / "bench" / RUN_ID
        argv = [a.format(fx=args.fixture, run=run, id=RUN_ID) for a in path]
        if args.only and not any(" ".join(path).startswith(w) for w in args.only):
            continue
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
        seen: dict[str, dict] = {}
        for tree in () if args.no_warm else trees.values():
            once(tree, argv)  # warm the file-system cache
        for _ in range(args.repeats):
            for name, tree in trees.items():
                cpu, wall, seen[name] = once(tree, argv)
                times[name].append((cpu, wall))
        label = "fathom " + " ".join(path).replace("{fx}/", "").replace("{id}", RUN_ID).replace(
            "{run}", "RUN"
        )
        for name in sorted(trees, reverse=True):
            cpu = statistics.median(c for c, _ in times[name])
            wall = statistics.median(w for _, w in times[name])
            torch = "yes" if seen[name]["torch"] else "no"
            print(
                f"{label:<52} {name:<6} {cpu:6.2f} {wall:6.2f}  {seen[name]['rc']!s:>2.14}  {torch}"
            )
            label = ""
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
