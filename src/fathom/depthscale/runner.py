"""Drive the benchmark: plan its runs, train each through the one trainer, resumably.

Each (depth, arm, seed) run (:func:`fathom.depthscale.config.plan_runs`) goes to
``<root>/<run-name>/`` through the studies' one execution policy
(:func:`fathom.study.execute.execute_run`, sequentially or on the local backend's workers):
the regularized step, the health instrument, checkpoints and the resume state like any run.
Running the same benchmark into the same ``root`` again skips complete intact runs,
retrains damaged complete ones (final hash checked), resumes interrupted ones
(byte-identically) and retries failed ones; a directory that holds another configuration is
refused.

The language-model benchmark (:mod:`fathom.depthscale.lm`) goes the same way, sequentially:
:func:`run_lm_benchmark`.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from fathom.base.io import atomic_write_json, ensure_writable_dir
from fathom.base.provenance import resolve_device
from fathom.base.terminal import OnProgress
from fathom.config import RunConfig
from fathom.data.prepare import prepare_splits
from fathom.depthscale.config import DepthScaleConfig, plan_runs
from fathom.depthscale.lm import LM_BENCHMARK, LMDepthScaleConfig, plan_lm_runs
from fathom.errors import FathomError
from fathom.rundir import RunDir, resume_file
from fathom.study.plan import RunSpec


def _benchmark_root(cfg: DepthScaleConfig, now: datetime | None = None) -> Path:
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return Path(cfg.runs_dir) / "depth_scaling" / f"{cfg.dataset}_{stamp}"


def _check_benchmark_file(root: Path, cfg: DepthScaleConfig) -> None:
    """A root that already holds a benchmark must hold this one."""
    path = root / "benchmark.json"
    if not path.exists():
        return
    try:
        stored = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FathomError(f"{str(path)!r} is unreadable ({e}); choose another --out") from None
    mine = cfg.model_dump(mode="json", exclude={"preset", "runs_dir", "threads", "data_dir"})
    theirs = {k: v for k, v in stored.get("config", {}).items() if k in mine}
    if theirs != mine:
        diff = [f"{k}: {theirs.get(k)!r} != {v!r}" for k, v in mine.items() if theirs.get(k) != v]
        raise FathomError(
            f"{str(root)!r} holds another depth-scaling benchmark ({'; '.join(diff)}); "
            "choose another --out, or rerun with the stored settings to continue it"
        )


def _run_one(run_cfg: RunConfig, run_dir: Path, splits, progress: OnProgress | None) -> str:
    """Bring one run to its final state by the studies' policy
    (:func:`fathom.study.execute.execute_run`): complete and intact runs skipped, damaged
    complete runs retrained (final hash checked), interrupted or failed ones resumed; return
    its status. A run that fails raises a FathomError naming it."""
    from fathom.study.execute import execute_run, plan_run

    (spec,) = _run_specs([run_cfg], run_dir.parent)
    tags = run_cfg.tags
    info = {"depth": tags["depth"], "arm": tags["arm"], "seed": run_cfg.seed}
    action, _ = plan_run(spec, retry_failed=True)
    if action in ("skip", "keep"):
        if progress is not None:
            status = RunDir(run_dir).status
            progress("skip", {**info, "status": status, "run_dir": str(run_dir)})
    elif progress is not None:
        resumable = action != "retrain" and resume_file(run_dir) is not None
        progress("start", {**info, "run_dir": str(run_dir), "resume": resumable})

    def relay(event: str, row: dict[str, Any]) -> None:
        if progress is not None and event == "epoch":
            progress("epoch", {**row, **info})

    out = execute_run(
        spec, retry_failed=True, splits_for=lambda cfg, device: splits, progress=relay
    )
    if out.status == "failed":
        raise FathomError(
            f"depth-scaling run {run_cfg.name} failed: {out.error}; rerun the same command to "
            "resume it"
        )
    if progress is not None and action not in ("skip", "keep"):
        progress("end", {**info, "status": out.status})
    return out.status


def run_benchmark(
    cfg: DepthScaleConfig,
    root: Path | None = None,
    *,
    progress: OnProgress | None = None,
    workers: int = 1,
) -> Path:
    """Every depth × arm × seed into ``root`` (default ``runs/depth_scaling/<dataset>_<time>``),
    sequentially in this process or on ``workers`` processes (:func:`_run_parallel`)."""
    if workers < 1:
        raise FathomError(f"--workers must be at least 1, got {workers}")
    device = resolve_device(cfg.device)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    root = Path(root) if root is not None else _benchmark_root(cfg)
    runs = plan_runs(cfg, root.resolve().name)  # `--out .` is the current directory's name
    splits = prepare_splits(runs[0].data, device)  # data errors surface before any directory
    _check_benchmark_file(root, cfg)
    root = ensure_writable_dir(root, where="--runs-dir")
    atomic_write_json(
        root / "benchmark.json", {"kind": "depth_scaling", "config": cfg.model_dump()}
    )
    if workers == 1:
        for run_cfg in runs:
            _run_one(run_cfg, root / run_cfg.name, splits, progress)
    else:
        _run_parallel(runs, root, workers, cfg.threads or 1, progress)
    return root


def _run_specs(runs: list[RunConfig], root: Path) -> list[RunSpec]:
    """The benchmark's runs as study :class:`~fathom.study.plan.RunSpec` (no phase)."""
    return [
        RunSpec(
            run_id=c.name,
            study=root.name,
            phase=None,
            recipe=f"staged_conv-{str(c.tags['arm']).lower()}-d{c.tags['depth']}",
            seed=c.seed,
            lr=c.optim.lr,
            run_dir=str(root / c.name),
            config=c.model_dump(mode="json"),
        )
        for c in runs
    ]


def _run_parallel(
    runs: list[RunConfig], root: Path, workers: int, threads: int, progress: OnProgress | None
) -> None:
    """Every run on ``workers`` local worker processes (the study's local backend): complete
    runs skipped, interrupted and failed ones resumed, as the sequential path does; a run
    that fails raises a FathomError naming it after every other run finished."""
    from fathom.study.backends import LocalBackend

    tags = {c.name: c for c in runs}

    def relay(out) -> None:
        if progress is not None:
            c = tags[out.run_id]
            info = {"depth": c.tags["depth"], "arm": c.tags["arm"], "seed": c.seed}
            progress("end", {**info, "status": out.status})

    outcomes = LocalBackend(workers=workers, threads=threads).run(
        _run_specs(runs, root), retry_failed=True, registry_file=None, progress=relay
    )
    failed = [f"{o.run_id}: {o.error}" for o in outcomes if o.status == "failed"]
    if failed:
        raise FathomError(
            f"{len(failed)} depth-scaling run(s) failed: {'; '.join(failed)}; "
            "rerun the same command to resume them"
        )


def run_lm_benchmark(cfg: LMDepthScaleConfig, root: Path, progress: Any = None) -> Path:
    """Every depth × arm × seed into ``root``, sequentially, by the studies' one execution
    policy (complete runs skipped, interrupted ones resumed, failed ones retried)."""
    import torch

    from fathom.base.io import atomic_write_json, ensure_writable_dir
    from fathom.base.provenance import resolve_device
    from fathom.data.prepare import prepare_splits
    from fathom.study.execute import execute_run
    from fathom.study.plan import RunSpec

    device = resolve_device(cfg.device)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    runs = plan_lm_runs(cfg, Path(root).resolve().name)
    splits = prepare_splits(runs[0].data, device)  # data errors before any directory
    root = ensure_writable_dir(Path(root), where="--out")
    atomic_write_json(root / "benchmark.json", {"kind": LM_BENCHMARK, "config": cfg.model_dump()})
    for c in runs:
        spec = RunSpec(
            run_id=c.name,
            study=root.name,
            phase=None,
            recipe=f"gpt-{str(c.tags['arm']).lower()}-d{c.tags['depth']}",
            seed=c.seed,
            lr=c.optim.lr,
            run_dir=str(root / c.name),
            config=c.model_dump(mode="json"),
        )
        out = execute_run(spec, retry_failed=True, splits_for=lambda cfg, dev: splits)
        if out.status == "failed":
            raise FathomError(
                f"depth-scaling run {c.name} failed: {out.error}; rerun the same command to resume it"
            )
        if progress is not None:
            progress(f"{c.tags['arm']}: depth={c.tags['depth']} seed={c.seed} status={out.status}")
    return root
