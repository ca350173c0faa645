"""Drive the language-model benchmark (:mod:`fathom.depthscale.lm`): every depth × arm × seed
through the studies' one execution policy, resumably."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fathom.depthscale.lm import LM_BENCHMARK, LMDepthScaleConfig, plan_lm_runs
from fathom.errors import FathomError


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
