"""CLI start-up: wall time of ``fathom --help`` and subcommand helps for two source trees, interleaved.

Usage: ``python bench/bench_cli_startup.py --before OLD/src [--repeats 15]`` (OLD: e.g.
``git archive main src | tar -x -C OLD``, the tree to compare with). Runs
``python -m fathom.cli <command> --help`` for each of :data:`COMMANDS` with ``PYTHONPATH``
set to each tree, alternating the two trees so load changes hit both alike; prints the
machine, the load average, the median and min of each and their ratio, and whether the
tree's help imported torch. A fresh interpreter per repeat (the file-system cache is warm
after the first).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS: tuple[str, ...] = (
    "",
    "train",
    "study run",
    "report",
    "data fetch",
    "audit",
    "depth-scaling",
)
"""The command paths timed (``""`` is ``fathom --help``)."""

PROBE = (
    "import sys, contextlib, io\n"
    "from fathom.cli import main\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    try:\n        main(sys.argv[1:])\n    except SystemExit:\n        pass\n"
    "print('torch' in sys.modules)\n"
)


def imports_torch(src: str, argv: list[str]) -> bool:
    """Whether ``fathom <argv>`` imports torch with ``src`` first on the path."""
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], env=env, check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1] == "True"


def _once(src: str, argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": src}
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "fathom.cli", *argv], env=env, check=True, stdout=subprocess.DEVNULL
    )
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--before",
        required=True,
        help="source tree to compare with, e.g. `git archive 3ed7edf src` unpacked",
    )
    ap.add_argument("--after", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument(
        "--commands", nargs="+", default=list(COMMANDS), help="command paths ('' = top level)"
    )
    args = ap.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}; load average {os.getloadavg()}"
    )
    for command in args.commands:
        argv = [*command.split(), "--help"]
        times: dict[str, list[float]] = {"before": [], "after": []}
        for tree in (args.before, args.after):  # warm the caches once
            _once(tree, argv)
        for _ in range(args.repeats):
            for name, tree in (("before", args.before), ("after", args.after)):
                times[name].append(_once(tree, argv))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"fathom {' '.join(argv)}: repeats {args.repeats}")
        for k, v in times.items():
            tree = args.before if k == "before" else args.after
            torch = "imports torch" if imports_torch(tree, argv) else "no torch"
            print(f"  {k:<6} median {med[k]:.3f} s  min {min(v):.3f} s  ({torch})")
        print(f"  ratio before/after {med['before'] / med['after']:.1f}x")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
