"""``fathom depth-scaling``: train both arms at every depth, then the table and its verdict."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fathom.config.inputs import check_data_dir
from fathom.errors import FathomError

if TYPE_CHECKING:  # the parser stays light: `fathom depth-scaling --help` imports no torch
    from fathom.depthscale.config import DepthScaleConfig


def _fmt(v: Any, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def _epoch_line(row: dict[str, Any]) -> str:
    """``Epoch 10: train=49.4% test=42.3% λ=1.940 σ=9.41e-01/3.56e-08 κ=2.6e+07``.

    train / test: dense accuracy (percent) on the fitting and test splits; λ: λ̂ on the probe
    examples; σ: median σ_max / σ_min (numerically nonzero) of the float64 input-output
    Jacobian; κ their median ratio. Health fields appear on health-check epochs only.
    """
    from fathom.base.units import fmt_percent

    line = (
        f"Epoch {row['epoch']}: train={fmt_percent(row.get('fit/acc'), 1)} "
        f"test={fmt_percent(row.get('test/acc'), 1)}"
    )
    if row.get("lyap/maximal") is not None:
        line += f" λ={row['lyap/maximal']:.3f}"
    if row.get("jac/sigma_max") is not None:
        line += f" σ={row['jac/sigma_max']:.2e}/{_fmt(row.get('jac/sigma_min'), '.2e')}"
        line += f" κ={_fmt(row.get('jac/kappa'), '.1e')}"
    if row.get("spike/silent_layers"):
        line += f" silent={len(row['spike/silent_layers'])}"
    return line


def _make_reporter(cfg: DepthScaleConfig, quiet: bool):
    """(progress callback, rich Progress or None)."""
    if quiet:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    from fathom.depthscale.config import ARMS

    total = len(cfg.depths) * len(ARMS) * len(cfg.seeds) * cfg.epochs
    task = progress.add_task("epochs", total=total)
    console = progress.console

    def report(event: str, row: dict[str, Any]) -> None:
        if event in ("start", "skip"):
            progress.start()  # after the data loaded: errors print without a bar
            what = {"skip": f"already {row.get('status')}", "start": "->"}[event]
            if row.get("resume"):
                what = "resuming"
            console.print(
                f"{row['arm']}: depth={row['depth']} seed={row['seed']} {what} {row['run_dir']}"
            )
            if event == "skip":
                progress.advance(task, cfg.epochs)
        elif event == "epoch" and row["epoch"] >= 1:
            progress.advance(task)
            if row["epoch"] % cfg.log_every == 0 or row["epoch"] == cfg.epochs:
                console.print(_epoch_line(row))
        elif event == "end":
            console.print(
                f"{row['arm']}: depth={row['depth']} seed={row['seed']} status={row['status']}"
            )

    return report, progress


def _cmd_lm_depth_scaling(args: argparse.Namespace, preset: str) -> int:
    """The language-model benchmark (a ``gpt-*`` preset): GPT depths, dense vs LayerDrop."""
    from fathom.depthscale.lm import lm_scale_note, make_lm_config

    conv_only = {
        "--timesteps": args.timesteps,
        "--lyap-weight": args.lyap_weight,
        "--lyap-target": args.lyap_target,
        "--width-mult": args.width_mult,
        "--residual": args.residual or None,
        "--no-batchnorm": args.no_batchnorm or None,
        "--workers": None if args.workers == 1 else args.workers,
    }
    given = [flag for flag, v in conv_only.items() if v is not None]
    if given:
        raise FathomError(
            f"{', '.join(given)} set the conv nets' benchmark; the language-model preset "
            f"{preset!r} takes --depths, --epochs, --seeds, --fit-subset, --eval-subset, "
            "--dataset, --data-dir, --device, --runs-dir, --out"
        )
    cfg = make_lm_config(
        preset,
        dataset=args.dataset,
        data_dir=args.data_dir,
        depths=args.depths,
        epochs=args.epochs,
        seeds=args.seeds,
        fit_subset=args.fit_subset,
        eval_subset=args.eval_subset,
        device=args.device,
        runs_dir=args.runs_dir,
    )
    from datetime import datetime

    from fathom.depthscale.lm_verdict import write_lm_table
    from fathom.depthscale.runner import run_lm_benchmark

    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    root = Path(args.out or Path(cfg.runs_dir) / "depth_scaling" / f"gpt_{stamp}")
    say = None if args.quiet else print
    root = run_lm_benchmark(cfg, root, progress=say)
    note = lm_scale_note(cfg)
    verdict = write_lm_table(root, note)
    print(note)
    print(f"Level: {verdict.level}. Scaling: {verdict.trend}.")
    for line in verdict.lines:
        print(f"- {line}")
    print(f"Results saved to {root}")
    return 0


def _cmd_depth_scaling(args: argparse.Namespace) -> int:
    from fathom.base.preflight import check_at_least_one, check_device, check_output_dir
    from fathom.depthscale.config import PRESETS, make_config, scale_note
    from fathom.depthscale.lm import LM_PRESETS

    check_at_least_one(args.workers, "--workers")
    check_device(args.device)
    check_output_dir(args.out)
    check_output_dir(args.runs_dir, "--runs-dir")
    for name in (args.preset, args.config):
        if name in LM_PRESETS:
            if args.preset is not None and args.config is not None:
                raise FathomError("give a config (file or preset name) or --preset, not both")
            return _cmd_lm_depth_scaling(args, name)
    preset, base = args.preset, {}
    if args.config is not None:
        if args.preset is not None:
            raise FathomError("give a config (file or preset name) or --preset, not both")
        if args.config in PRESETS:
            preset = args.config
        else:
            base = _config_file(args.config).model_dump(exclude={"kind"})
    overrides = dict(
        dataset=args.dataset,
        data_dir=args.data_dir,
        depths=args.depths,
        timesteps=args.timesteps,
        epochs=args.epochs,
        lyap_weight=args.lyap_weight,
        lyap_target=args.lyap_target,
        seeds=args.seeds,
        width_mult=args.width_mult,
        fit_subset=args.fit_subset,
        eval_subset=args.eval_subset,
        device=args.device,
        runs_dir=args.runs_dir,
        residual=True if args.residual else None,
        batchnorm=False if args.no_batchnorm else None,
    )
    cfg = make_config(preset, **{**base, **{k: v for k, v in overrides.items() if v is not None}})
    check_data_dir(cfg.data_dir, "data_dir (--data-dir)", cfg.dataset)  # never the cache silently
    check_device(cfg.device)
    from fathom.depthscale.runner import run_benchmark  # torch: only once the config is valid
    from fathom.depthscale.table import print_results, write_table

    report, progress = _make_reporter(cfg, args.quiet)
    root = Path(args.out) if args.out else None
    try:
        root = run_benchmark(cfg, root, progress=report, workers=args.workers)
    finally:
        if progress is not None:
            progress.stop()
    note = scale_note(cfg)
    table = write_table(root, note)
    print_results(table, note)
    print(f"Results saved to {root}")
    return 0


def _config_file(path: str) -> DepthScaleConfig:
    from fathom.depthscale.config import DepthScaleConfig
    from fathom.study.family import load_config

    cfg, origin = load_config(path)
    if not isinstance(cfg, DepthScaleConfig):
        raise FathomError(
            f"{origin} is a {cfg.kind} config; `fathom depth-scaling` needs kind = 'depth_scaling'"
        )
    return cfg


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "depth-scaling",
        help="conv / spiking conv nets at several depths, vanilla vs Lyapunov-regularized",
        description=__doc__,
    )
    p.add_argument(
        "config", nargs="?", default=None, help="a depth_scaling TOML file or preset name"
    )
    p.add_argument(
        "--preset",
        default=None,
        help="a depth-scaling preset, e.g. quick; gpt-quick / gpt-gpu: a GPT at several "
        "depths, dense vs LayerDrop, in nats per token (an unknown name is refused with the list)",
    )
    p.add_argument("--dataset", default=None, help="mnist | fashion-mnist | cifar10 | cifar100")
    p.add_argument("--data-dir", default=None, help="folder holding the dataset's official files")
    p.add_argument("--depths", type=int, nargs="+", default=None)
    p.add_argument("--timesteps", type=int, default=None, help="spiking timesteps T (0 = ANN)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--lyap-weight", type=float, default=None, help="λ_reg (default 0.3)")
    p.add_argument("--lyap-target", type=float, default=None, help="λ_target (default -0.1)")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--width-mult", type=float, default=None)
    p.add_argument("--fit-subset", type=int, default=None, help="first n fitting examples")
    p.add_argument("--eval-subset", type=int, default=None, help="first n val and test examples")
    p.add_argument("--residual", action="store_true", help="residual control")
    p.add_argument("--no-batchnorm", action="store_true", help="no-BatchNorm control")
    p.add_argument("--device", default=None, help="auto | cpu | cuda")
    p.add_argument("--runs-dir", default=None, help="parent of depth_scaling/ (default runs)")
    p.add_argument(
        "--out",
        default=None,
        help="exact output directory (default timestamped); rerunning into it skips complete "
        "runs and resumes interrupted ones",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="runs in parallel on this many processes (the study's local backend; default 1)",
    )
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_depth_scaling)
