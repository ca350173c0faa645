"""``fathom reproduce PRESET_OR_TOML`` and ``fathom diagnose head [CONFIG]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fathom.errors import FathomError


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from fathom.base.preflight import check_at_least_one, check_output_dir
    from fathom.reproduce.config import load_pipeline

    check_at_least_one(args.workers, "--workers")
    check_at_least_one(args.threads, "--threads")
    check_output_dir(args.runs_dir, "--runs-dir")
    name, pipe, study, origin = load_pipeline(args.pipeline)  # refused before torch
    from fathom.reproduce.pipeline import Context, locations, reproduce
    from fathom.study.backends import make_backend
    from fathom.study.cli import slurm_options
    from fathom.study.scaledown import scale_down_sentence, scaled_down

    if pipe.depth_scaling is not None:
        return _reproduce_depth(args, name, pipe, study, origin)
    if args.data_dir is not None:
        raise FathomError(
            "--data-dir applies to depth-scaling pipelines (seed-000); a study takes its data "
            "from its [base.data] section or FATHOM_DATA"
        )
    threads = args.threads or study.study.threads_per_run or 1
    if threads < 1:
        raise FathomError(f"--threads must be at least 1, got {threads}")
    backend = make_backend(
        args.backend,
        workers=args.workers,
        address=args.address,
        threads=threads,
        slurm=slurm_options(args),
    )
    say = _say(args)
    ctx = Context(
        name=name,
        pipe=pipe,
        study=study,
        runs_dir=Path(args.runs_dir),
        backend=backend,
        say=say,
        threads=threads,
        retry_failed=args.retry_failed,
    )
    say(f"reproduce {name} ({origin}): study {study.study.name} on {backend.name}")
    say(scale_down_sentence(scaled_down(study)))
    reproduce(ctx)
    print(f"reproduction: {ctx.root / 'reproduce' / 'reproduction.md'} and reproduction.json")
    print(f"report: {ctx.root / 'report' / 'report.html'}")
    print("where each seed table's counterpart is:")
    from fathom.reproduce.seeds import load_seeds

    data = load_seeds()
    places = locations(ctx)
    for t in data.tables_of("study"):
        print(f"  {data.source(t)}: {t.title}\n    -> {places[t.id]}")
    return 0


def _say(args: argparse.Namespace):
    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    return say


def _reproduce_depth(args: argparse.Namespace, name: str, pipe, cfg, origin: str) -> int:
    """A depth-scaling pipeline: the benchmark, its table, seed 000's table beside it."""
    from fathom.depthscale.config import scale_note
    from fathom.reproduce.depth_pipeline import DepthContext, reproduce_depth
    from fathom.reproduce.depth_render import print_comparison

    if args.backend != "local":
        raise FathomError(
            f"--backend {args.backend}: a depth-scaling pipeline runs on local workers only "
            "(--workers N); use `fathom depth-scaling` for other setups"
        )
    overrides = {"data_dir": args.data_dir, "threads": args.threads}
    cfg = cfg.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    say = _say(args)
    ctx = DepthContext(name, pipe, cfg, Path(args.runs_dir), say, workers=args.workers)
    say(f"reproduce {name} ({origin}): depth scaling on {cfg.dataset} into {ctx.root}")
    say(scale_note(cfg))
    result = reproduce_depth(ctx)
    print_comparison(result)
    print(f"reproduction: {ctx.root / 'reproduce' / 'reproduction.md'} and reproduction.json")
    print(f"Fathom's table: {ctx.root / 'table.md'}")
    return 0


def _cmd_diagnose_head(args: argparse.Namespace) -> int:
    from fathom.base.preflight import check_device, check_output_dir
    from fathom.study.family import load_run_config_or_preset

    check_device(args.device)
    check_output_dir(args.out)
    if args.epochs < 1:
        raise FathomError(f"--epochs must be at least 1, got {args.epochs}")
    base = load_run_config_or_preset(args.config)
    from fathom.reproduce.head import HeadSettings, head_lines, run_head_diagnostic

    settings = HeadSettings(
        seed=args.seed,
        epochs=args.epochs,
        width_mult=args.width_mult,
        fit_subset=args.fit_subset,
        eval_subset=args.eval_subset,
        lr=args.lr,
        device=args.device,
    )
    if args.epochs < 1:
        raise FathomError(f"--epochs must be at least 1, got {args.epochs}")
    result = run_head_diagnostic(base, settings, args.out, threads=args.threads)
    print(
        f"head diagnostic: seed {settings.seed}, {settings.epochs} epochs, test split; "
        "ReLU head -> linear head (only model.output_relu differs)"
    )
    for line in head_lines(result):
        print(line)
    print(f"wrote {Path(args.out) / 'head.md'} and head.json")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from fathom.study.cli import add_slurm_arguments

    p = sub.add_parser(
        "reproduce",
        help="run a seed's protocol end to end: study, audit, curvature, head diagnostic, "
        "comparison with the seed's numbers, report (resumable at every step)",
    )
    p.add_argument(
        "pipeline",
        metavar="PRESET_OR_TOML",
        help="a pipeline preset (quick: 2-core CPU; seed-003, seed-000: a GPU; seed-000-tiny: "
        "a CPU smoke test) or a pipeline TOML",
    )
    p.add_argument("--runs-dir", default="runs", help="parent of the study directory")
    p.add_argument("--workers", type=int, default=1, help="local worker processes for the study")
    p.add_argument("--backend", choices=["local", "ray", "slurm"], default="local")
    p.add_argument("--address", help="Ray cluster address (--backend ray)")
    add_slurm_arguments(p)
    p.add_argument("--threads", type=int, help="torch threads per run (final hashes depend on it)")
    p.add_argument("--retry-failed", action="store_true", help="retry study runs that failed")
    p.add_argument(
        "--data-dir",
        help="folder holding cifar-100-python.tar.gz (depth-scaling pipelines: seed-000)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the final lines")
    p.set_defaults(func=_cmd_reproduce)

    d = sub.add_parser("diagnose", help="matched-pair diagnostics (head: ReLU vs linear head)")
    dsub = d.add_subparsers(dest="diagnose_command", required=True, metavar="SUBCOMMAND")
    h = dsub.add_parser(
        "head",
        help="ReLU head vs linear head (only model.output_relu differs): per-class test counts",
    )
    h.add_argument(
        "config",
        nargs="?",
        default="ciresan-fidelity",
        help="run preset or TOML of the ReLU-head run (default ciresan-fidelity: raw pixels, ReLU head)",
    )
    h.add_argument("--seed", type=int, default=104)
    h.add_argument("--epochs", type=int, default=5)
    h.add_argument("--width-mult", type=float, help="scale the widths (e.g. 0.1 on a CPU)")
    h.add_argument("--fit-subset", type=int, help="first N fitting examples (CPU scale-down)")
    h.add_argument("--eval-subset", type=int, help="first N validation and test examples")
    h.add_argument("--lr", type=float, help="learning rate (default: the config's)")
    h.add_argument("--device", choices=["auto", "cpu", "cuda"])
    h.add_argument("--threads", type=int, default=None, help="torch threads")
    h.add_argument("--out", default="runs/diagnose-head", help="output directory")
    h.set_defaults(func=_cmd_diagnose_head)
