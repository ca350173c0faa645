"""``fathom curvature RUN_DIR... --epochs 0 1 5 10 20 50 100 [--probe 128] [--loss mse --target one_hot]``."""

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
    losses = _losses(args, runs)  # refused here, before torch

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

    for rd, loss in zip(runs, losses, strict=True):
        rows = run_curvature(
            rd,
            args.epochs,
            probe=args.probe,
            out_dir=args.out,
            device=args.device,
            save_diagonals=args.save_diagonals,
            progress=lambda line: console(stderr=True).print(line, soft_wrap=True),
            estimator=how,
            loss=loss,
        )
        cols = TOKEN_SUMMARY_COLUMNS if is_language_model(rd) else SUMMARY_COLUMNS
        print(summary_markdown(rd.run_id, args.probe, rows, cols))
    return 0


_LOSS_FLAGS = {
    "name": "loss",
    "reduction": "reduction",
    "label_smoothing": "label_smoothing",
    "ignore_index": "ignore_index",
    "target": "target",
}


def _losses(args: argparse.Namespace, runs: list) -> list:
    """Per run, the loss of the flags over the run's own ``[loss]`` (``None`` where no flag
    is given: the run's), validated without torch (:func:`fathom.config.run.loss_with`)."""
    given = {key: getattr(args, flag) for key, flag in _LOSS_FLAGS.items()}
    if all(v is None for v in given.values()):
        return [None] * len(runs)
    from fathom.config.model_kinds import model_kind
    from fathom.config.run import loss_with
    from fathom.errors import FathomError

    out = []
    for rd in runs:
        if model_kind(rd.config.model.kind).tokens:
            raise FathomError(
                f"{rd.run_id} is a language model's run, whose curvature is of its own loss "
                "(token cross-entropy); drop --loss, --reduction, --label-smoothing, "
                "--ignore-index and --target"
            )
        out.append(loss_with(rd.config.loss, "the --loss flags", **given))
    return out


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
    p.add_argument(
        "--loss",
        help="a classifier's loss: cross_entropy, mse or bce_with_logits (default: the run's "
        "[loss], cross_entropy when it has none)",
    )
    p.add_argument("--reduction", help="mean or sum (default: the run's)")
    p.add_argument(
        "--label-smoothing", type=float, help="cross_entropy's label smoothing (default 0)"
    )
    p.add_argument("--ignore-index", type=int, help="cross_entropy's ignored label (default -100)")
    p.add_argument(
        "--target",
        help="how the labels meet the loss: labels (cross_entropy) or one_hot (what mse and "
        "bce_with_logits need)",
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
