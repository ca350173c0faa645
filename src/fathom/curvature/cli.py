"""``fathom curvature RUN_DIR... --epochs 0 1 5 10 20 50 100 [--probe 128]``."""

from __future__ import annotations

import argparse


def _cmd_curvature(args: argparse.Namespace) -> int:
    from fathom.base.terminal import console
    from fathom.rundir import RunDir

    runs = [RunDir(p) for p in args.run_dirs]  # manifests only: refused before torch
    if args.out and len(runs) > 1:
        from fathom.errors import FathomError

        raise FathomError(
            "--out takes one run directory; omit it to write <run>/curvature/ for each run"
        )
    from fathom.base.preflight import check_device, check_output_dir

    check_device(args.device)
    check_output_dir(args.out)

    from fathom.curvature.rundir import (
        SUMMARY_COLUMNS,
        TOKEN_SUMMARY_COLUMNS,
        Estimating,
        is_language_model,
        run_curvature,
        summary_markdown,
    )

    how = Estimating(
        name=args.estimator,
        samples=args.samples,
        seed=args.seed,
        memory=args.budget_memory,
        backward_passes=args.budget_passes,
    )

    for rd in runs:
        rows = run_curvature(
            rd,
            args.epochs,
            probe=args.probe,
            out_dir=args.out,
            device=args.device,
            save_diagonals=args.save_diagonals,
            progress=lambda line: console(stderr=True).print(line, soft_wrap=True),
            estimator=how,
        )
        cols = TOKEN_SUMMARY_COLUMNS if is_language_model(rd) else SUMMARY_COLUMNS
        print(summary_markdown(rd.run_id, args.probe, rows, cols))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "curvature",
        help="exact float64 curvature (GGN / empirical Fisher / Jacobian diagonals, KFAC, mismatch) of saved checkpoints",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--epochs", type=int, nargs="+", help="checkpoint epochs (default: every saved epoch)"
    )
    p.add_argument("--probe", type=int, default=128, help="first N fitting examples (default 128)")
    p.add_argument("--out", help="output directory (default: RUN_DIR/curvature)")
    p.add_argument("--device", default="cpu", help="torch device for the float64 computation")
    p.add_argument(
        "--save-diagonals",
        action="store_true",
        help="also write the exact diagonals as epoch-NNNN.diagonals.safetensors",
    )
    p.add_argument(
        "--estimator",
        default="auto",
        help="a language model's GGN diagonal: auto (exact when it fits the budget, else "
        "Monte-Carlo), exact, mc or hutchinson (default auto; a classifier's snapshot is "
        "always exact)",
    )
    p.add_argument("--samples", type=int, default=8, help="MC draws per window (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the MC draws (default 0)")
    p.add_argument("--budget-memory", default="4GB", help="memory auto may spend (default 4GB)")
    p.add_argument(
        "--budget-passes",
        type=int,
        default=2048,
        help="output directions per example auto may pull back (default 2048)",
    )
    p.set_defaults(func=_cmd_curvature)
