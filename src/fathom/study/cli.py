"""``fathom study run|status`` and ``fathom runs list|show``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fathom.errors import FathomError


def _threads(args: argparse.Namespace, study: Any) -> int:
    """Torch threads per run: ``--threads``, else the study's ``threads_per_run``, else 1.

    Not derived from ``--workers``: on the CPU the final parameters depend on torch's
    intra-op thread count, so a fixed count keeps hashes equal across worker counts and
    backends.
    """
    threads = args.threads if args.threads is not None else study.study.threads_per_run or 1
    if threads < 1:
        raise FathomError(f"--threads must be at least 1, got {threads}")
    return threads


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fathom.study.backends import make_backend
    from fathom.study.config import load_study
    from fathom.study.report import print_summary
    from fathom.study.runner import run_study, scale_down_text

    study, origin = load_study(args.study)
    if args.backend != "ray" and args.address:
        raise FathomError("--address is for --backend ray; drop it or add --backend ray")
    backend = make_backend(
        args.backend, workers=args.workers, address=args.address, threads=_threads(args, study)
    )
    console = Console(stderr=True)

    def progress(event: str, info: Any) -> None:
        if args.quiet:
            return
        if event == "phase":
            console.print(f"[bold]{info}[/bold]")
        else:
            h = info.final_params[:8] if info.final_params else "—"
            extra = "".join(f"  ({t})" for t in (info.note, info.error) if t)
            console.print(
                f"  {info.run_id:<30} {info.action:<7} {info.status:<8} {info.wall_s:5.1f}s "
                f"params {h}{extra}",
                overflow="fold",
            )

    if not args.quiet:
        console.print(
            f"study {study.study.name} ({origin}) on {backend.name}; runs under {Path(args.runs_dir) / study.study.name}"
        )
        console.print(scale_down_text({"scale_down": list(study.study.scale_down)}))
    result = run_study(
        study,
        args.runs_dir,
        backend,
        retry_failed=args.retry_failed,
        progress=progress,
        origin=origin,
        allow_source_change=args.allow_source_change,
    )
    if not args.quiet:
        print_summary(result.summary)
    print(f"summary: {result.root / 'summary.md'} and summary.json ({result.wall_s:.1f} s)")
    failed = [o for o in result.outcomes if o.status == "failed"]
    return 1 if failed else 0


def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from fathom.study.status import study_status

    rows, name = study_status(Path(args.dir))
    table = Table(
        title=f"Study {name}: {sum(r['status'] == 'complete' for r in rows)}/{len(rows)} runs complete"
    )
    for col in ("Run", "Phase", "Recipe", "Seed", "LR", "Status", "Epochs", "Final params"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["run_id"],
            r["phase"],
            r["recipe"],
            str(r["seed"]),
            "—" if r["lr"] is None else f"{r['lr']:g}",
            r["status"],
            r["epochs"],
            (r["final_params"] or "—")[:12],
        )
    Console().print(table)
    return 0


def _registry(args: argparse.Namespace):
    from fathom.study.registry import Registry, registry_path

    path = registry_path(args.runs_dir)
    if not path.exists():
        raise FathomError(
            f"no run registry at {str(path)!r}; run a study with --runs-dir {args.runs_dir} first"
        )
    return Registry(path)


def cmd_runs_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    rows = _registry(args).query(
        study=args.study, phase=args.phase, recipe=args.recipe, seed=args.seed, status=args.status
    )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title=f"{len(rows)} runs")
    for col in (
        "Study",
        "Run",
        "Phase",
        "Recipe",
        "Seed",
        "LR",
        "Status",
        "Sel. test acc",
        "Final test acc",
        "Final test CE",
    ):
        table.add_column(col)

    def f(x: float | None, spec: str = ".4f") -> str:
        return "—" if x is None else format(x, spec)

    for r in rows:
        table.add_row(
            r["study"],
            r["run_id"],
            r["phase"],
            r["recipe"],
            str(r["seed"]),
            f(r["lr"], "g"),
            r["status"],
            f(r["selected_test_acc"]),
            f(r["final_test_acc"]),
            f(r["final_test_ce"]),
        )
    Console().print(table)
    return 0


def cmd_runs_show(args: argparse.Namespace) -> int:
    rows = _registry(args).get(args.run_id, args.study)
    if not rows:
        raise FathomError(
            f"no run {args.run_id!r} in the registry; list runs with `fathom runs list`"
        )
    if len(rows) > 1:
        raise FathomError(
            f"run id {args.run_id!r} exists in studies {[r['study'] for r in rows]}; pass --study"
        )
    print(json.dumps(rows[0], indent=2))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    study = sub.add_parser(
        "study", help="run a grid of runs (recipes x seeds, LR tuning) and summarise it"
    )
    ssub = study.add_subparsers(dest="study_command", required=True, metavar="SUBCOMMAND")
    run = ssub.add_parser("run", help="run or resume a study from a preset name or TOML file")
    run.add_argument(
        "study",
        metavar="PRESET_OR_TOML",
        help="a preset (ciresan-sd, ciresan-sd-quick) or a study TOML",
    )
    run.add_argument(
        "--runs-dir", default="runs", help="parent of <study>/ and registry.sqlite (default: runs)"
    )
    run.add_argument(
        "--workers", type=int, default=1, help="local worker processes (default: 1, sequential)"
    )
    run.add_argument("--backend", choices=["local", "ray"], default="local")
    run.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    run.add_argument(
        "--threads",
        type=int,
        help="torch threads per run (default: the study's threads_per_run, else 1; final hashes depend on it)",
    )
    run.add_argument(
        "--retry-failed",
        action="store_true",
        help="retry runs that failed by themselves (runs failed by their environment, e.g. a full disk, are always retried)",
    )
    run.add_argument(
        "--allow-source-change",
        action="store_true",
        help="resume interrupted runs even though the fathom source changed (recorded)",
    )
    run.add_argument("--quiet", action="store_true", help="print only the final line")
    run.set_defaults(func=cmd_run)
    status = ssub.add_parser("status", help="per-run state of a study directory")
    status.add_argument("dir", help="the study directory, e.g. runs/ciresan-sd-quick")
    status.set_defaults(func=cmd_status)

    runs = sub.add_parser("runs", help="query the run registry")
    rsub = runs.add_subparsers(dest="runs_command", required=True, metavar="SUBCOMMAND")
    ls = rsub.add_parser("list", help="runs in the registry, filtered")
    ls.add_argument("--runs-dir", default="runs")
    ls.add_argument("--study")
    ls.add_argument("--phase", choices=["tuning", "main"])
    ls.add_argument("--recipe")
    ls.add_argument("--seed", type=int)
    ls.add_argument("--status", choices=["complete", "diverged", "failed", "running", "absent"])
    ls.add_argument("--json", action="store_true", help="print the rows as JSON")
    ls.set_defaults(func=cmd_runs_list)
    show = rsub.add_parser("show", help="one run's registry row as JSON")
    show.add_argument("run_id")
    show.add_argument("--runs-dir", default="runs")
    show.add_argument("--study")
    show.set_defaults(func=cmd_runs_show)
