"""``fathom train`` and ``fathom validate``."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fathom.config.export import live_targets
from fathom.errors import FathomError, did_you_mean

if TYPE_CHECKING:  # the parser stays light: `fathom train --help` imports no pydantic or torch
    from fathom.base.terminal import TrainProgress
    from fathom.config import LiveConfig, RunConfig


def _parse_set(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; values parsed as JSON when possible (``0.03``, ``[1,2]``, ``true``)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise FathomError(f"--set expects key=value, got {item!r} (e.g. --set optim.lr=0.03)")
        key, raw = item.split("=", 1)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run config of ``fathom train [CONFIG] [--set ...]``: without ``CONFIG``, the
    defaults with the ``--set`` keys, which must name the model (never the defaults' full
    run by accident)."""
    from fathom.config import RunConfig
    from fathom.study.family import load_run_config_or_preset, require_model

    cfg = load_run_config_or_preset(args.config) if args.config else RunConfig()
    updates = _parse_set(args.set or [])
    if getattr(args, "device", None):
        updates["device"] = args.device
    if getattr(args, "name", None):
        updates["name"] = args.name
    cfg = cfg.with_updates(updates) if updates else cfg
    if not args.config and not any(k.split(".")[0] == "model" for k in updates):
        require_model(None, "")
    return cfg


def _make_progress(quiet: bool) -> TrainProgress | None:
    """The live display (:class:`fathom.base.terminal.TrainProgress`), or ``None`` when ``--quiet``."""
    from fathom.base.terminal import TrainProgress

    return None if quiet else TrainProgress()


def live_settings(configured: LiveConfig, flag: str | None) -> LiveConfig:
    """The ``[live]`` settings with ``--live`` (when given) choosing the backends."""
    from fathom.export.live import parse_live

    return configured if flag is None else configured.with_backends(parse_live(flag))


def recorded_live(run_dir: Path) -> LiveConfig:
    """The live-tracking settings a run's manifest records (off for a run that has none)."""
    from pydantic import ValidationError

    from fathom.config.live import LiveConfig
    from fathom.rundir import RunDir

    try:
        return LiveConfig.model_validate(RunDir(run_dir).recorded.live)
    except ValidationError as e:
        raise FathomError(
            f"{run_dir}/manifest.json records live settings this version cannot read ({e.errors()[0]['msg']}); "
            "choose the backends with --live (or --live off)"
        ) from None


def _cmd_train(args: argparse.Namespace) -> int:
    if args.live is not None:  # a bad flag is named before the config is read
        from fathom.export.live import parse_live

        parse_live(args.live)
    if args.resume:
        given = ("set", "name", "device", "runs_dir")
        ignored = [f"--{k.replace('_', '-')}" for k in given if getattr(args, k, None)]
        if ignored:
            raise FathomError(
                f"{' and '.join(ignored)} cannot change a run being resumed: --resume continues "
                f"{args.resume!r} with the config recorded in its manifest. Drop "
                f"{' and '.join(ignored)}, or start a new run with them"
            )
    from fathom.base.preflight import check_device, check_output_dir

    check_device(args.device)
    if args.resume:
        _resume_preflight(Path(args.resume))
    if args.resume and args.config:
        from fathom.train.loop import check_resumable

        check_resumable(Path(args.resume), config_from_args(args))
    cfg = None
    if args.resume:
        run_dir = Path(args.resume)
        tracking = live_settings(recorded_live(run_dir), args.live)
    else:
        cfg = config_from_args(args)
        named_inputs(cfg, args.config or "--set")  # refused before anything is written
        check_device(cfg.device)  # the config's device, or --device over it
        check_output_dir(args.runs_dir or "runs", "--runs-dir")
        run_dir = Path(args.runs_dir or "runs") / cfg.study / cfg.name
        _name_free(run_dir)
        tracking = live_settings(cfg.live, args.live)
        cfg = cfg.model_copy(update={"live": tracking})
    from fathom.base.interrupts import interrupts_unwrapped, sigterm_interrupts

    created = None if args.resume else _first_missing(run_dir)
    try:
        # `kill PID` is recorded like Ctrl-C, and so is a Ctrl-C inside a serializer
        with sigterm_interrupts(), interrupts_unwrapped():
            result, reports = _run_training(args, cfg, run_dir, tracking)
    except KeyboardInterrupt:
        _remove_unstarted(created, run_dir)
        _register_run(run_dir)
        print(f"fathom train: {_interrupted_message(run_dir)}", file=sys.stderr)
        return 130
    except BaseException:  # refused before the run started (data too small, ...): no trace
        _remove_unstarted(created, run_dir)
        _register_run(run_dir)  # a run that started and failed is indexed as failed
        raise
    warning = _register_run(run_dir)
    if warning:
        print(warning, file=sys.stderr)
    for report in reports:
        print("\n".join(report.lines()))
    print(
        f"{result.status}: {result.run_dir} (epochs {result.epochs_completed}, final params {result.final_params})"
    )
    if result.status == "diverged":
        print(f"diverged in epoch {result.diverged_epoch}; see manifest.json status_reason")
        return 3
    from fathom.rundir import RunDir
    from fathom.study.records import outcome_warnings

    for warning in outcome_warnings(RunDir(result.run_dir)):
        print(f"warning: {warning}")
    return 0


def _resume_preflight(run_dir: Path) -> None:
    """What ``--resume DIR`` is refused for before torch is imported: a directory that holds no
    run, and a run already complete (its state said with what to do instead)."""
    from fathom.rundir import RunDir, run_state

    rd = RunDir(run_dir)  # no manifest, a file: refused naming the fix
    if rd.status == "complete":
        state = run_state(rd)
        raise FathomError(
            f"run {str(run_dir)!r} is already complete ({state.progress}); nothing to resume. "
            f"Read it with `fathom report {run_dir}`, or train a new run with another --name"
        )


def _name_free(run_dir: Path) -> None:
    """Refuse, before torch is imported, a run directory that already holds a run (the
    writer refuses it too, under its lock: this is the early, fast answer)."""
    if not (run_dir / "manifest.json").exists():
        return
    from fathom.rundir import RunDir, run_state

    try:
        state = run_state(RunDir(run_dir))
        held = f"{state.status}, {state.progress}"
        fix = "" if state.finished else f"continue it with `{state.resume_command}`, or "
    except FathomError:  # a damaged manifest: the name is taken all the same
        held, fix = "unreadable manifest", ""
    raise FathomError(
        f"run directory {str(run_dir)!r} already holds a run ({held}): the name "
        f"{run_dir.name!r} is taken in study {run_dir.parent.name!r}; {fix}choose another "
        "--name (or --runs-dir)"
    )


def _run_training(
    args: argparse.Namespace, cfg: RunConfig | None, run_dir: Path, tracking: LiveConfig
) -> tuple[Any, list[Any]]:
    """Train (or resume) with the live display and trackers; ``(result, tracker reports)``."""
    from fathom.export.live import LiveTracker, fan_out  # torch: only once the input is valid
    from fathom.train.loop import resume, train

    tracker = LiveTracker(run_dir, tracking, cfg) if tracking.enabled else None
    live = _make_progress(args.quiet)
    progress = fan_out(live, tracker, _registrar(run_dir))
    try:
        if args.resume:
            result = resume(
                args.resume,
                progress=progress,
                allow_source_change=args.allow_source_change,
                live=tracking,
            )
        else:
            assert cfg is not None
            result = train(cfg, run_dir, progress=progress)
    finally:
        if live is not None:
            live.close()
        reports = tracker.close() if tracker is not None else []
    return result, reports


def _register_run(run_dir: Path) -> str | None:
    """Index ``run_dir`` in the registry of its runs directory (``RUNS_DIR/registry.sqlite``,
    the one a study writes: ``fathom runs list|show`` find every run). ``None`` when done or
    when there is no run to index; a warning line when the registry cannot be written (the
    run itself is unaffected: the registry is an index, the directory the evidence)."""
    if not (run_dir / "manifest.json").exists():
        return None
    from fathom.study.records import run_row
    from fathom.study.registry import Registry, registry_path

    try:
        Registry(registry_path(run_dir.parent.parent)).upsert([run_row(run_dir)])
    except FathomError as e:
        return f"warning: {run_dir} is not indexed in the run registry: {e}"
    return None


def _registrar(run_dir: Path) -> Any:
    """A progress observer that indexes the run once, at its first history row (the
    manifest exists then), so that ``fathom runs list`` shows it while it trains."""
    done: list[bool] = []

    def observe(event: str, info: dict[str, Any]) -> None:
        if event == "epoch" and not done:
            done.append(True)
            _register_run(run_dir)

    return observe


def _first_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist yet (``None``: it exists)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            break
        missing = p
    return missing


def _remove_unstarted(created: Path | None, run_dir: Path) -> None:
    """Remove the directories this command created (``created`` and below) when the run never
    started: no manifest, no writer, nothing in them but released (empty) lock files. Bad
    input found once training began to set up (a subset larger than the data) then leaves
    nothing behind."""
    from fathom.rundir import lock_holder
    from fathom.rundir.lock import RUN_LOCK

    if created is None or (run_dir / "manifest.json").exists() or lock_holder(run_dir):
        return
    files = [p for p in created.rglob("*") if not p.is_dir()]
    if all(p.name == RUN_LOCK and p.stat().st_size == 0 for p in files):
        shutil.rmtree(created, ignore_errors=True)


def _interrupted_message(run_dir: Path) -> str:
    """What Ctrl-C or SIGTERM left: the epochs kept and the command that continues the run,
    or that nothing was written (stopped before the run's first record)."""
    from fathom.rundir import RunDir, run_state

    try:
        state = run_state(RunDir(run_dir))
    except FathomError:
        return f"interrupted before {run_dir} was started; nothing was written"
    if state.finished:  # the interrupt came while the last record was written
        return f"interrupted once the run had finished: {state.sentence()}; nothing was lost"
    return f"{state.sentence()} (completed epochs are kept)"


def named_inputs(cfg: Any, origin: str) -> list[str]:
    """Check what a config of any kind names outside itself (:mod:`fathom.config.inputs`):
    factories imported, data paths present; one line per thing checked. An error names
    ``origin`` (the file or preset)."""
    from fathom.config import RunConfig
    from fathom.config.inputs import check_data_dir, check_inputs

    try:
        if cfg.kind == "depth_scaling":
            check_data_dir(cfg.data_dir, "data_dir", cfg.dataset)
            return [f"data_dir {cfg.data_dir}: exists"] if cfg.data_dir else []
        run = cfg if isinstance(cfg, RunConfig) else cfg.base  # a study: its base run config
        return check_inputs(run.data, run.model)
    except FathomError as e:
        raise FathomError(f"{origin}: {e}") from None


def _cmd_validate(args: argparse.Namespace) -> int:
    """Validate any config (file or preset) and any ``fathom reproduce`` pipeline preset: the
    schema, and what it names (factories imported, data paths present); print its kind and
    every value, defaults included. A name that two commands use (``quick``: a
    depth-scaling preset and a reproduce pipeline) is said to be both, and both are validated."""
    from fathom.reproduce.config import pipeline_preset_names
    from fathom.study.family import load_config

    name = args.config
    pipeline = not Path(name).exists() and name in pipeline_preset_names()
    try:
        cfg, origin = load_config(name)
    except FathomError as e:
        if pipeline:
            cfg = None
        elif Path(name).exists() or name.endswith(".toml"):
            raise
        else:  # an unknown name: the pipelines are names `validate` takes too
            hint = did_you_mean(name, pipeline_preset_names(), prefix="reproduce ")
            raise FathomError(
                f"{e}; reproduce pipelines: {', '.join(pipeline_preset_names())}"
                + (f" ({hint})" if hint else "")
            ) from None
    if cfg is not None:
        if pipeline:
            print(
                f"note: {name!r} names two presets: the {cfg.kind} preset (validated first) and "
                f"the reproduce pipeline `fathom reproduce {name}` (validated next)"
            )
        checked = named_inputs(cfg, origin)
        print(f"{origin}: valid {cfg.kind} config")
        for line in checked:
            print(f"  {line}")
        data = cfg.model_dump(mode="json")
        live = getattr(cfg, "live", None)
        if live is not None:  # excluded from the training config (and its hash), shown here
            data["live"] = live.model_dump(mode="json")
        print(json.dumps(data, indent=2))
    if pipeline:
        _print_pipeline(name)
    return 0


def _print_pipeline(name: str) -> None:
    """Validate the ``fathom reproduce`` pipeline preset ``name`` with what it runs (its
    study or depth-scaling config, checked against each other) and print it."""
    from fathom.reproduce.config import load_pipeline

    _, pipe, target, _ = load_pipeline(name)
    runs = f"study {pipe.study}" if pipe.study else f"depth-scaling {pipe.depth_scaling.config}"
    print(f"reproduce pipeline {name}: valid pipeline ({runs}: valid {target.kind} config)")
    print(json.dumps(pipe.model_dump(mode="json"), indent=2))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one run into a run directory")
    p.add_argument(
        "config", nargs="?", help="run config TOML or run preset name (defaults apply when omitted)"
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key, e.g. optim.lr=0.03",
    )
    p.add_argument("--runs-dir", help="parent of <study>/<name> (default: runs)")
    p.add_argument("--name", help="run name (directory under runs/<study>/)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--resume", metavar="RUN_DIR", help="continue an interrupted run; ends byte-identical"
    )
    p.add_argument(
        "--allow-source-change",
        action="store_true",
        help="resume although the fathom source changed since the run started (recorded)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--live",
        metavar="TARGETS",
        help=f"stream history rows while training: {', '.join(live_targets())} "
        "(comma-separated, any of them) or off; overrides the config's [live] backends (a "
        "resume keeps the recorded ones); logs under RUN_DIR/live/ unless [live] places them "
        "(default: off)",
    )
    p.set_defaults(func=_cmd_train)

    v = sub.add_parser(
        "validate",
        help="check a run, study or depth-scaling config (file or preset) and print it with defaults",
    )
    v.add_argument(
        "config",
        help="a TOML file, a preset name of any kind, or a `fathom reproduce` pipeline preset",
    )
    v.set_defaults(func=_cmd_validate)
