"""``fathom audit STUDY_OR_RUN_DIR``: every branch mask, interactions, resilience, routing."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from fathom.audit.options import CHECKPOINT_CHOICES
from fathom.errors import FathomError

if TYPE_CHECKING:  # the parser stays light: `fathom audit --help` imports no numpy or torch
    from fathom.audit.checkpoint import AuditSettings

MAX_MASKS_HELP = 4096
"""The default of ``--max-masks`` shown in its help: :data:`fathom.audit.masks.MAX_ENUMERATED_MASKS`
(importing that module costs numpy; ``tests/test_cli.py`` checks the two agree)."""


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise FathomError(f"expected comma-separated integers, got {text!r} (e.g. 1,256)") from None
    if not values or any(v <= 0 for v in values):
        raise FathomError(f"expected positive integers, got {text!r} (e.g. 1,256)")
    return values


def _contrast(text: str) -> tuple[int, tuple[int, ...]]:
    """``"1:4,9"`` -> ``(1, (4, 9))``."""
    if ":" not in text:
        raise FathomError(f"--contrast expects A:B1,B2 (e.g. 1:4,9), got {text!r}")
    a, b = text.split(":", 1)
    try:
        return int(a), tuple(int(v) for v in b.split(","))
    except ValueError:
        raise FathomError(
            f"--contrast expects integers A:B1,B2 (e.g. 1:4,9), got {text!r}"
        ) from None


def settings_from_args(args: argparse.Namespace) -> AuditSettings:
    from fathom.audit.checkpoint import AuditSettings
    from fathom.audit.masks import MAX_ENUMERATED_MASKS
    from fathom.audit.tokens import LM_MAX_MASKS

    a, b = _contrast(args.contrast) if args.contrast is not None else (None, None)
    if args.tolerance < 0:
        raise FathomError(f"--tolerance {args.tolerance} must be >= 0 (an error-rate increase)")
    return AuditSettings(
        checkpoints=CHECKPOINT_CHOICES[args.checkpoint],
        max_masks=MAX_ENUMERATED_MASKS if args.max_masks is None else args.max_masks,
        token_max_masks=LM_MAX_MASKS if args.max_masks is None else args.max_masks,
        sample_masks=args.sample_masks,
        keep=args.keep,
        contrast_a=a,
        contrast_b=b,
        margin_bins=args.margin_bins,
        router=not args.no_router,
        tolerance=args.tolerance,
        tree_depth=args.tree_depth,
        n_permutations=args.permutations,
        timing_batch_sizes=_int_list(args.timing_batch_sizes),
        timing_repeats=args.timing_repeats,
        seed=args.seed,
        device=args.device,
    )


def _run_audit(args: argparse.Namespace) -> int:
    from fathom.audit.options import find_audit_runs

    target = Path(args.path)
    find_audit_runs(target)  # a wrong path is refused before torch is imported
    from fathom.base.preflight import check_device, check_output_dir

    check_device(args.device)
    check_output_dir(args.out)
    settings = settings_from_args(args)
    from rich.console import Console

    from fathom.audit.run import audit_runs

    console = Console(stderr=True)
    out = Path(args.out) if args.out else target / "audit"
    say = None if args.quiet else console.print
    live = say if console.is_terminal else None  # per-mask lines: a terminal, not a log
    result = audit_runs(target, settings, out, progress=say, mask_progress=live)
    for run in result["runs"] if result.get("model") == "language model" else []:
        for which, rec in run["checkpoints"].items():
            for sentence in rec.get("sentences", []):
                print(f"[{which}] {run['run_id']}: {sentence}")
    for which, agg in result["aggregate"].items():
        for p in agg["paired_damage"]:
            print(f"[{which}] {p['sentence']}")
        for name, arm in agg["arms"].items():
            if arm["routing"]:
                print(f"[{which}] {name}: {arm['routing']['sentence']}")
    print(f"wrote {out / 'audit.md'} and {out / 'audit.json'} ({len(result['runs'])} run(s))")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "audit",
        help="layer-removal audit of a run or study directory",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("path", metavar="STUDY_OR_RUN_DIR")
    p.add_argument("--checkpoint", choices=sorted(CHECKPOINT_CHOICES), default="selected")
    p.add_argument("--out", help="output directory (default STUDY_OR_RUN_DIR/audit)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    p.add_argument(
        "--max-masks",
        type=int,
        default=None,
        help=f"enumerate all 2^k masks up to this many (default {MAX_MASKS_HELP}; a language "
        "model's: 64, beyond it every single and pair removal and the greedy removal path)",
    )
    p.add_argument(
        "--sample-masks",
        type=int,
        default=None,
        metavar="N",
        help="evaluate N sampled masks (full, single deletions, empty + random) instead of all",
    )
    p.add_argument("--keep", type=int, default=None, help="mask size for resilience (default k//2)")
    p.add_argument(
        "--contrast",
        default=None,
        help=(
            "class contrast A:B1,B2 (default: the dataset's own, 1:4,9 on MNIST; else 0 vs "
            "every other class)"
        ),
    )
    p.add_argument("--margin-bins", type=int, default=5)
    p.add_argument("--no-router", action="store_true", help="skip routing (no scikit-learn)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.005,
        help="allowed error-rate increase over the dense network (default 0.005)",
    )
    p.add_argument("--tree-depth", type=int, default=3)
    p.add_argument("--permutations", type=int, default=1000)
    p.add_argument("--timing-batch-sizes", default="1,256")
    p.add_argument("--timing-repeats", type=int, default=7)
    p.add_argument("--seed", type=int, default=0, help="seed of the router split and shuffles")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_run_audit)
