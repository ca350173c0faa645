"""Run a seed-000 (depth-scaling) pipeline on a tiny synthetic CIFAR-100-format archive.

The CPU dry run of ``bench/gpu_reproduce.sh PRESET=seed-000-tiny``: CIFAR-100 is never
downloaded and the official archive (169 MB) is not on this machine, so this writes an
archive laid out like the official ``cifar-100-python.tar.gz`` (pickled ``train`` / ``test``
batches, ``fine_labels``; random images) and registers its own checksums for this process
only, so that the real reader path (:func:`fathom.data.cifar.read_cifar_archive`, checksums
verified) runs. The results are meaningless; the pipeline, the table and the side-by-side
printing are what it checks.

    python bench/seed000_tiny.py PIPELINE_TOML RUNS_DIR [--images N]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]


def main() -> int:
    from fathom.cli import main as fathom_main
    from fathom.data import DATASETS
    from test_data_cifar import checksummed, write_archive  # the tests' archive writer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pipeline")
    p.add_argument("runs_dir")
    p.add_argument("--images", type=int, default=100, help="train and test images each")
    args = p.parse_args()
    data = Path(args.runs_dir) / ".synthetic-cifar100"
    data.mkdir(parents=True, exist_ok=True)
    os.environ["FATHOM_CACHE"] = str(data / "cache")
    spec = DATASETS["cifar100"]
    write_archive(data / spec.archive, spec, per_batch=args.images)
    DATASETS["cifar100"] = checksummed(spec, data / spec.archive, per_batch=args.images)
    print(
        f"synthetic CIFAR-100-format archive: {data / spec.archive} ({args.images} + "
        f"{args.images} random images; not CIFAR-100)",
        flush=True,
    )
    argv = ["reproduce", args.pipeline, "--runs-dir", args.runs_dir, "--data-dir", str(data)]
    return fathom_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
