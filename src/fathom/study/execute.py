"""Execute one run of a study, resumably: the function every backend calls per run.

Given a :class:`RunSpec`, :func:`execute_run` looks at the run directory first:

* complete, every file intact                   -> skipped (nothing is recomputed);
* complete but damaged (torn or edited history, a corrupt checkpoint, a resume state that is
  not its manifest's: :meth:`RunDir.problems` ``deep``) -> retrained (training is
  deterministic, so the retrained run must end with the recorded final hash: checked);
* diverged                                      -> kept (a divergence is a result);
* running / interrupted, with a resume state    -> resumed from its last epoch boundary;
* failed by its environment (full disk, read-only or failing file system) -> retried;
* failed otherwise                              -> retried only with ``retry_failed``
  (resumed from its last resume state when there is one);
* absent, or killed before its first boundary   -> trained from the start.

Every retry says why (:attr:`RunOutcome.note`). A run directory holding another config
than the spec is refused, naming the field.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fathom.base.interrupts import interrupts_unwrapped
from fathom.base.io import config_digest
from fathom.config import LiveConfig, describe_config_change, validate_run_config
from fathom.errors import FathomError
from fathom.rundir import DirLock, RunDir, resume_file
from fathom.rundir.lock import RUN_LOCK
from fathom.study.plan import RunSpec


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`execute_run` did (``action``, ``note``: why a run was retried)."""

    run_id: str
    phase: str
    recipe: str
    seed: int
    lr: float
    run_dir: str
    action: str
    status: str
    final_params: str | None
    wall_s: float
    error: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify_complete(run_dir: Path) -> str:
    """The final-parameter hash of a complete run, after checking its final checkpoint file."""
    rd = RunDir(run_dir)
    recorded = rd.record.hashes.final_params
    on_disk = rd.checkpoint_hash("final")
    if recorded is None or recorded != on_disk:
        raise FathomError(
            f"run {str(run_dir)!r} is marked complete but its final-parameter hash {recorded} "
            f"does not match its final checkpoint entry {on_disk}; the directory was modified. "
            "Delete the run directory to retrain it"
        )
    rd.load_state("final")  # verifies the tensors against the recorded digest
    return recorded


def _state(spec: RunSpec) -> tuple[str, RunDir | None]:
    """``("absent" | "unstarted" | status, run)`` of the spec's run directory."""
    path = Path(spec.run_dir)
    if not (path / "manifest.json").exists():
        return ("absent" if not path.exists() else "unstarted"), None
    rd = RunDir(path)
    stored_hash = rd.record.config_hash
    if stored_hash != config_digest(spec.config):
        why = describe_config_change(
            rd.record.config, stored_hash, spec.config, (" (on disk)", " (study)")
        )
        raise FathomError(
            f"run directory {spec.run_dir!r} holds a run of another config ({why}); "
            "the study definition changed since it ran. Use another --runs-dir or study name, "
            "or delete that run directory"
        )
    return rd.status, rd


def _wipe(path: Path) -> None:
    """Remove a run directory's contents, holding its lock (refused if another writer has it)."""
    if not path.exists():
        return
    with DirLock(path):
        for child in path.iterdir():
            if child.name == RUN_LOCK:
                continue
            shutil.rmtree(child) if child.is_dir() else child.unlink()


def _plan(state: str, rd: RunDir | None, retry_failed: bool) -> tuple[str, str | None]:
    """``(action, note)`` for a run in ``state``: skip / keep / resume / retrain (and why)."""
    if state == "complete":
        problems = rd.problems(deep=True) if rd is not None else []  # every file, digested
        if not problems:
            return "skip", None
        return "retrain", f"retrained: {'; '.join(problems)}"
    if state == "diverged":
        return "keep", None
    if state == "failed":
        env = rd is not None and rd.recorded.failure.environment
        if not (env or retry_failed):
            return "keep", None
        why = "its environment failed" if env else "--retry-failed"
        reason = None if rd is None else rd.header.status_reason
        return "retry", f"retried ({why}); earlier failure: {reason}"
    return "run", None


def plan_run(spec: RunSpec, retry_failed: bool = False) -> tuple[str, str | None]:
    """What :func:`execute_run` will do with ``spec``'s directory: ``(action, note)``, the
    action one of ``skip``, ``keep``, ``retrain``, ``retry``, ``run``."""
    state, rd = _state(spec)
    return _plan(state, rd, retry_failed)


def execute_run(
    spec: RunSpec,
    *,
    retry_failed: bool = False,
    threads: int | None = None,
    registry_file: str | None = None,
    splits_for: Any = None,
    allow_source_change: bool = False,
    live: LiveConfig | tuple[str, ...] = (),
    tracker: Any = None,
    progress: Any = None,
) -> RunOutcome:
    """Bring ``spec``'s run directory to a final state (see the module docstring): the one
    policy of studies, depth scaling and the reproduction pipelines.

    ``threads`` sets ``torch.set_num_threads`` for this process; ``registry_file`` (when
    given) receives the run's row; ``live`` is the study's live-tracking settings (a
    :class:`~fathom.config.live.LiveConfig`, or the backends to stream to) and ``tracker`` the
    observer class that streams them, ``tracker(run_dir, live, config)`` (the commands pass
    :class:`fathom.export.live.LiveTracker`: a study, an analysis, never imports the export
    layer itself); ``splits_for(cfg, device) -> DataSplits`` replaces
    :func:`cached_splits` (tests use synthetic data). Errors of the run itself are returned as a ``failed``
    outcome with the message; bad input (``FathomError``) is raised. ``allow_source_change``
    lets a resumed run continue under changed source (recorded in its manifest);
    ``progress(event, info)`` receives the trainer's events.
    """
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    path = Path(spec.run_dir)
    state, rd = _state(spec)

    def outcome(action: str, status: str, final: str | None, *details: str | None) -> RunOutcome:
        out = RunOutcome(
            *(spec.run_id, spec.phase, spec.recipe, spec.seed, spec.lr, spec.run_dir),
            *(action, status, final, time.perf_counter() - t0, *details),
        )
        if registry_file is not None:
            from fathom.study.records import registry_row
            from fathom.study.registry import Registry

            Registry(registry_file).upsert([registry_row(spec)])
        return out

    action, note = _plan(state, rd, retry_failed)
    if action == "skip":
        return outcome("skipped", "complete", verify_complete(path))
    if action == "keep" and state == "diverged":
        return outcome("kept", "diverged", None)
    if action == "keep":
        reason = rd.header.status_reason if rd is not None else None
        return outcome(
            "kept", "failed", None, f"failed earlier ({reason}); rerun with --retry-failed"
        )
    expected = None
    if action == "retrain":
        expected = rd.record.hashes.final_params if rd else None
        _wipe(path)
        state = "unstarted"
    has_resume = resume_file(path) is not None
    if state in ("running", "interrupted", "failed") and has_resume:
        verb, resume = ("retried" if state == "failed" else "resumed"), True
    else:
        _wipe(path)  # killed before its first epoch boundary: nothing to keep
        verb, resume = ("retried" if action in ("retry", "retrain") else "trained"), False
    options = dict(resume=resume, phase=spec.phase, allow_source_change=allow_source_change)
    try:
        with interrupts_unwrapped():  # Ctrl-C inside a serializer: the interrupt, not a failure
            result, bad = _train_spec(spec, path, splits_for, (live, tracker, progress), options)
    except FathomError:
        raise
    except Exception as e:  # the run's own failure is data: recorded in its manifest
        return outcome(verb, "failed", None, f"{type(e).__name__}: {e}", note)
    if expected is not None and result.final_params != expected:
        note = f"{note}; the retrained run ended with another final hash than recorded ({expected[:12]}…)"
    return outcome(verb, result.status, result.final_params, bad, note)


def _train_spec(
    spec: RunSpec,
    path: Path,
    splits_for: Any,
    streaming: tuple[LiveConfig | tuple[str, ...], Any, Any],
    options: dict[str, Any],
) -> tuple[Any, str | None]:
    """Train (or resume) ``spec`` into ``path``; return the result and live-tracking problems.

    ``streaming`` is ``(live settings, tracker class, progress)`` as given to :func:`execute_run`.
    """
    from fathom.base.provenance import resolve_device
    from fathom.config.live import live_config
    from fathom.train.loop import train

    cfg = validate_run_config(spec.config, origin=f"study run {spec.run_id}")
    live, make_tracker, progress = streaming
    if live and make_tracker is None:
        raise FathomError(
            "live tracking was asked for without a tracker: pass "
            "tracker=fathom.export.live.LiveTracker with live=... (the fathom commands do)"
        )
    if live:  # recorded in the manifest; never part of the training config
        cfg = cfg.model_copy(update={"live": live_config(live)})
    splits = (splits_for or cached_splits)(cfg, resolve_device(cfg.device))
    tracker = make_tracker(path, cfg.live, cfg) if live else None
    observers = [p for p in (tracker, progress) if p is not None]

    def observe(event: str, info: dict[str, Any]) -> None:
        for p in observers:
            p(event, info)

    try:
        result = train(cfg, path, splits=splits, progress=observe if observers else None, **options)
    finally:
        reports = tracker.close() if tracker is not None else []
    bad = [line for r in reports if not r.ok for line in r.lines()[:3]]
    return result, "; ".join(bad) or None


_SPLITS_CACHE: dict[str, Any] = {}


def cached_splits(cfg: Any, device: Any) -> Any:
    """``prepare_splits(cfg, device)``, kept per process for runs that share the data config."""
    from fathom.train.loop import prepare_splits

    key = config_digest({"data": cfg.data.model_dump(mode="json"), "device": str(device)})
    if key not in _SPLITS_CACHE:
        _SPLITS_CACHE.clear()
        _SPLITS_CACHE[key] = prepare_splits(cfg, device)
    return _SPLITS_CACHE[key]
