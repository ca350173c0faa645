"""``fathom study run|status`` (``fathom runs list|show``: :mod:`fathom.study.runs_cli`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fathom.config.export import live_targets
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


def slurm_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """:class:`fathom.study.slurm.SlurmBackend` fields from ``--slurm-*`` (``None`` off Slurm)."""
    if args.backend != "slurm":
        given = [k for k in ("slurm_partition", "slurm_gpus") if getattr(args, k, None)]
        if given:
            raise FathomError(
                f"--{given[0].replace('_', '-')} is for --backend slurm; add it or drop the option"
            )
        return None
    return {
        "folder": args.slurm_folder or str(Path(args.runs_dir) / "submitit"),
        "cluster": args.slurm_cluster,
        "partition": args.slurm_partition,
        "gpus_per_task": args.slurm_gpus or 0,
        "timeout_min": args.slurm_timeout_min,
    }


def add_slurm_arguments(p: argparse.ArgumentParser) -> None:
    """``--slurm-*`` options shared by ``study run`` and ``reproduce``."""
    p.add_argument("--slurm-partition", help="Slurm partition (--backend slurm)")
    p.add_argument("--slurm-gpus", type=int, help="GPUs per run (--backend slurm; default 0)")
    p.add_argument(
        "--slurm-timeout-min", type=int, default=180, help="time limit per run in minutes"
    )
    p.add_argument(
        "--slurm-folder", help="submitit logs and pickles (default RUNS_DIR/submitit; shared FS)"
    )
    p.add_argument(
        "--slurm-cluster",
        choices=["slurm", "local", "debug"],
        help="submitit executor (default: slurm when sbatch exists, else local processes)",
    )


def progress_line(info: Any) -> str:
    """``  main-residual_dropout-s101  trained  complete  12.3s  params 3f9a0c1d2e4b``.

    The run id is padded to the longest id a study of the shipped recipes makes (31
    characters), so the line fits 80 columns; why a run was retried and an error reason
    follow and may wrap.
    """
    from fathom.base.terminal import short_hash

    extra = "".join(f"  ({t})" for t in (getattr(info, "note", None), info.error) if t)
    return (
        f"  {info.run_id:<31} {info.action:<7} {info.status:<8} {info.wall_s:6.1f}s "
        f"params {short_hash(info.final_params)}{extra}"
    )


def _cmd_run(args: argparse.Namespace) -> int:
    from fathom.base.preflight import check_at_least_one, check_output_dir
    from fathom.study.config import load_study
    from fathom.train.cli import live_settings, named_inputs

    check_at_least_one(args.workers, "--workers")  # before torch: the study's own checks
    check_output_dir(args.runs_dir, "--runs-dir")
    study, origin = load_study(args.study)
    named_inputs(study, origin)  # factories import, data paths exist: before any run starts
    if args.backend != "ray" and args.address:
        raise FathomError("--address is for --backend ray; drop it or add --backend ray")
    tracking = live_settings(study.live, args.live)
    threads = _threads(args, study)
    slurm = slurm_options(args)
    from rich.console import Console  # the heavy modules only once the input is valid

    from fathom.base.terminal import Tally
    from fathom.export.live import LiveTracker
    from fathom.study.backends import make_backend
    from fathom.study.report import print_summary
    from fathom.study.runner import run_study
    from fathom.study.scaledown import scale_down_sentence, scaled_down

    backend = make_backend(
        args.backend,
        workers=args.workers,
        address=args.address,
        threads=threads,
        slurm=slurm,
        live=tracking if tracking.enabled else (),
        tracker=LiveTracker if tracking.enabled else None,
    )
    console = Console(stderr=True)
    tally = Tally(_planned_runs(study, args.runs_dir))

    def progress(event: str, info: Any) -> None:
        if args.quiet:
            return
        if event == "phase":
            console.print(f"[bold]{info}[/bold]")
        else:
            worked = info.action not in ("skipped", "kept")
            console.print(f"{progress_line(info)}\n  {tally.add(worked)}", overflow="fold")

    if not args.quiet:
        console.print(
            f"study {study.study.name} ({origin}) on {backend.name}; "
            f"runs under {Path(args.runs_dir) / study.study.name}"
        )
        console.print(scale_down_sentence(scaled_down(study), study.study.protocol))
    from fathom.study.watch import StudyWatch  # the runs' epochs between the run lines

    watch = None if args.quiet else StudyWatch(Path(args.runs_dir) / study.study.name, console)
    try:
        if watch is not None:
            watch.start()
        result = run_study(
            study,
            args.runs_dir,
            backend,
            retry_failed=args.retry_failed,
            progress=progress,
            origin=origin,
            allow_source_change=args.allow_source_change,
        )
    finally:
        if watch is not None:
            watch.stop()
    if not args.quiet:
        print_summary(result.summary)
    counts = status_counts([{"status": o.status} for o in result.outcomes])
    print(f"summary: {result.root / 'summary.md'} and summary.json ({result.wall_s:.1f} s)")
    print(f"runs: {counts}")
    failed = [o for o in result.outcomes if o.status == "failed"]
    return 1 if failed else 0


def _planned_runs(study: Any, runs_dir: str) -> int:
    """Runs a study makes: its tuning grid plus recipes x seeds of the main phase."""
    from fathom.study.plan import tuning_specs

    return len(tuning_specs(study, runs_dir)) + len(study.study.recipes) * len(study.study.seeds)


_STATUS_ORDER = (
    "complete",
    "diverged",
    "failed",
    "running",
    "interrupted",
    "not started",
    "waiting for tuning",
)


def status_counts(rows: list[dict[str, Any]]) -> str:
    """``"12 complete, 2 diverged, 1 failed, 15 waiting for tuning (30 runs)"``.

    Every state is counted on its own: a diverged run finished (its divergence is a result),
    a failed one did not; neither is counted as complete.
    """
    counts = {st: sum(r["status"] == st for r in rows) for st in _STATUS_ORDER}
    other = sorted({r["status"] for r in rows} - set(_STATUS_ORDER))
    counts.update({st: sum(r["status"] == st for r in rows) for st in other})
    parts = [f"{k} {st}" for st, k in counts.items() if k or st in _STATUS_ORDER[:3]]
    return f"{', '.join(parts)} ({len(rows)} runs)"


def status_table(rows: list[dict[str, Any]], name: str, wide: bool = False):
    """Run, status, epochs and final-parameter hash (12 hex digits; all with ``wide``)."""
    from fathom.base.terminal import short_hash, table

    columns = ["Run", "Status", "Epochs", "Final params"]
    if wide:
        columns[1:1] = ["Phase", "Recipe", "Seed", "LR"]
    body = []
    for r in rows:
        extra = [r["phase"], r["recipe"], r["seed"], "—" if r["lr"] is None else f"{r['lr']:g}"]
        body.append(
            [
                r["run_id"],
                *(extra if wide else []),
                r["status"],
                r["epochs"],
                short_hash(r["final_params"], wide),
            ]
        )
    return table(
        f"Study {name}: {status_counts(rows)}",
        columns,
        body,
    )


def _cmd_status(args: argparse.Namespace) -> int:
    from fathom.base.terminal import console
    from fathom.study.status import study_status

    rows, name = study_status(Path(args.dir))
    if args.json:
        print(json.dumps({"study": name, "runs": rows}, indent=2))
        return 0
    console(args.wide).print(status_table(rows, name, args.wide))
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
    run.add_argument("--backend", choices=["local", "ray", "slurm"], default="local")
    run.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    add_slurm_arguments(run)
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
    run.add_argument(
        "--live",
        metavar="TARGETS",
        help="stream every run's history rows while it trains: "
        f"{', '.join(live_targets())} (comma-separated, any of them) or off; overrides the "
        "study's [live] backends; logs under each RUN_DIR/live/ unless [live] places them "
        "(default: off)",
    )
    run.set_defaults(func=_cmd_run)
    status = ssub.add_parser("status", help="per-run state of a study directory")
    status.add_argument("dir", help="the study directory, e.g. runs/ciresan-sd-quick")
    status.add_argument("--wide", action="store_true", help="all columns and full hashes")
    status.add_argument("--json", action="store_true", help="print the rows as JSON")
    status.set_defaults(func=_cmd_status)
