"""Execute one run of a study, resumably: the function every backend calls per run.

Given a :class:`RunSpec`, :func:`execute_run` looks at the run directory first:

* complete, final checkpoint hash checks        -> skipped (nothing is recomputed);
* diverged                                      -> kept (a divergence is a result);
* running / interrupted, with a resume state    -> resumed from its last epoch boundary;
* failed                                        -> retried only with ``retry_failed``
  (resumed from its last resume state when there is one);
* absent, or killed before its first boundary   -> trained from the start.

A run directory holding another config than the spec is refused, naming the field.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fathom.config import config_diff, validate_run_config
from fathom.errors import FathomError
from fathom.io import config_digest
from fathom.study.plan import RunSpec

OUTCOME_ACTIONS = ("skipped", "trained", "resumed", "retried", "kept", "failed")


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`execute_run` did (``action``) and the run's resulting state."""

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify_complete(run_dir: Path) -> str:
    """The final-parameter hash of a complete run, after checking its final checkpoint file."""
    from fathom.rundir import RunDir

    rd = RunDir(run_dir)
    recorded = rd.manifest.get("hashes", {}).get("final_params")
    on_disk = rd.checkpoint_hash("final")
    if recorded is None or recorded != on_disk:
        raise FathomError(
            f"run {str(run_dir)!r} is marked complete but its final-parameter hash {recorded} "
            f"does not match its final checkpoint entry {on_disk}; the directory was modified. "
            "Delete the run directory to retrain it"
        )
    rd.load_state("final")  # verifies the tensors against the recorded digest
    return recorded


def _state(spec: RunSpec) -> tuple[str, dict[str, Any] | None]:
    """``("absent" | "unstarted" | status, manifest)`` of the spec's run directory."""
    from fathom.rundir import RunDir

    path = Path(spec.run_dir)
    if not (path / "manifest.json").exists():
        return ("absent" if not path.exists() else "unstarted"), None
    rd = RunDir(path)
    stored_hash = rd.manifest.get("config_hash")
    if stored_hash != config_digest(spec.config):
        diff = config_diff(
            rd.manifest.get("config", {}), spec.config, labels=(" (on disk)", " (study)")
        )
        raise FathomError(
            f"run directory {spec.run_dir!r} holds a run of another config ({'; '.join(diff)}); "
            "the study definition changed since it ran. Use another --runs-dir or study name, "
            "or delete that run directory"
        )
    return rd.status, rd.manifest


def execute_run(
    spec: RunSpec,
    *,
    retry_failed: bool = False,
    threads: int | None = None,
    registry_file: str | None = None,
    splits_for: Any = None,
    live: tuple[str, ...] = (),
) -> RunOutcome:
    """Bring ``spec``'s run directory to a final state (see the module docstring).

    ``threads`` sets ``torch.set_num_threads`` for this process; ``registry_file`` (when
    given) receives the run's row; ``live`` names live-tracking targets
    (:mod:`fathom.export.live`); ``splits_for(cfg, device) -> DataSplits`` replaces
    :func:`cached_splits` (tests use synthetic data). Errors of the run itself are returned as a ``failed``
    outcome with the message; bad input (``FathomError``) is raised.
    """
    import torch

    from fathom.train.loop import train

    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    path = Path(spec.run_dir)
    state, manifest = _state(spec)

    def outcome(
        action: str, status: str, final: str | None, error: str | None = None
    ) -> RunOutcome:
        out = RunOutcome(
            spec.run_id,
            spec.phase,
            spec.recipe,
            spec.seed,
            spec.lr,
            spec.run_dir,
            action,
            status,
            final,
            time.perf_counter() - t0,
            error,
        )
        if registry_file is not None:
            from fathom.study.records import registry_row
            from fathom.study.registry import Registry

            Registry(registry_file).upsert([registry_row(spec)])
        return out

    if state == "complete":
        return outcome("skipped", "complete", verify_complete(path))
    if state == "diverged":
        return outcome("kept", "diverged", None)
    if state == "failed" and not retry_failed:
        reason = (manifest or {}).get("status_reason")
        return outcome(
            "kept", "failed", None, f"failed earlier ({reason}); rerun with --retry-failed"
        )

    cfg = validate_run_config(spec.config, origin=f"study run {spec.run_id}")
    has_resume = (path / "checkpoints" / "resume.pt").exists()
    if state in ("running", "failed") and has_resume:
        action = "retried" if state == "failed" else "resumed"
        resume = True
    else:
        if path.exists():
            shutil.rmtree(path)  # killed before its first epoch boundary: nothing to keep
        action = "retried" if state == "failed" else "trained"
        resume = False
    from fathom.provenance import resolve_device

    splits = (splits_for or cached_splits)(cfg, resolve_device(cfg.device))
    from fathom.export.live import LiveTracker

    tracker = LiveTracker(path, live, cfg) if live else None
    try:
        result = train(cfg, path, splits=splits, resume=resume, phase=spec.phase, progress=tracker)
    except FathomError:
        raise
    except Exception as e:  # the run's own failure is data: recorded in its manifest
        return outcome(action, "failed", None, f"{type(e).__name__}: {e}")
    finally:
        reports = tracker.close() if tracker is not None else []
    bad = [line for r in reports if not r.ok for line in r.lines()[:3]]
    return outcome(action, result.status, result.final_params, "; ".join(bad) or None)


_SPLITS_CACHE: dict[str, Any] = {}


def cached_splits(cfg: Any, device: Any) -> Any:
    """``prepare_splits(cfg, device)``, kept per process for runs that share the data config."""
    from fathom.train.loop import prepare_splits

    key = config_digest({"data": cfg.data.model_dump(mode="json"), "device": str(device)})
    if key not in _SPLITS_CACHE:
        _SPLITS_CACHE.clear()
        _SPLITS_CACHE[key] = prepare_splits(cfg, device)
    return _SPLITS_CACHE[key]
