"""``fathom export DIR --to TARGET``: write an export, then verify it by reading it back.

The targets are :data:`fathom.config.export.EXPORT_TARGETS`' (jsonl, wandb, tensorboard)."""

from __future__ import annotations

import argparse

from fathom.config.export import export_targets


def _cmd_export(args: argparse.Namespace) -> int:
    from fathom.export.run import export, verify

    if args.verify_only:
        report = verify(args.dir, args.to, args.out)
    else:
        report = export(args.dir, args.to, args.out, force=args.force, checkpoints=args.checkpoints)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export runs to JSONL, W&B (offline) or TensorBoard and verify by reading back",
    )
    p.add_argument("dir", help="a study directory or one run directory")
    p.add_argument("--to", required=True, choices=export_targets(), help="export target")
    p.add_argument("--out", help="export directory (default: DIR/exports/<target>)")
    p.add_argument(
        "--force", action="store_true", help="replace a different export already in --out"
    )
    p.add_argument(
        "--checkpoints",
        action="store_true",
        help="W&B: also each run's saved checkpoints as model artifacts (hash-checked)",
    )
    p.add_argument(
        "--verify-only", action="store_true", help="re-check an existing export; write nothing"
    )
    p.set_defaults(func=_cmd_export)
