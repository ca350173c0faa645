"""``fathom reproduce seed-000``: the depth-scaling benchmark, its table, seed 000's beside it.

Steps, each recorded in ``<root>/reproduce/pipeline.json`` and skipped when complete and
verified (:class:`fathom.reproduce.state.PipelineState`), under the one pipeline lock:

1. ``depth-scaling``: every depth x arm x seed run into ``<root>/<run>/``
   (:func:`fathom.depthscale.runner.run_benchmark`: complete runs skipped, interrupted ones
   resumed), then ``table.md`` / ``table.json`` (:func:`fathom.depthscale.table.write_table`);
2. ``compare``: ``reproduce/reproduction.json`` / ``.md``, the seed log's table beside
   Fathom's (:mod:`fathom.reproduce.depth_compare`).

``<root>`` is ``<runs-dir>/<pipeline name>`` (``runs/seed-000``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fathom.base.io import atomic_write_json, atomic_write_text, config_digest
from fathom.base.terminal import Say
from fathom.reproduce.config import PipelineConfig
from fathom.reproduce.pipeline import open_state, run_step
from fathom.reproduce.state import PipelineState, pipeline_lock


@dataclass
class DepthContext:
    """One invocation of a depth-scaling pipeline."""

    name: str
    pipe: PipelineConfig
    cfg: Any  # fathom.depthscale.config.DepthScaleConfig
    runs_dir: Path
    say: Say
    workers: int = 1
    actions: dict[str, str] = field(default_factory=dict)
    plan: dict[str, str] = field(
        default_factory=lambda: {
            "depth-scaling": "train every arm x depth x seed of the benchmark, resumable",
            "compare": "put the seed's numbers beside Fathom's (reproduction.md)",
        }
    )
    t0: float = field(default_factory=time.perf_counter)

    @property
    def root(self) -> Path:
        return self.runs_dir / self.name


def _config_inputs(cfg: Any) -> dict[str, Any]:
    """What the runs depend on: not where they are written or read from (the data is
    verified by its hashes, each run records its split hash) nor the preset's name."""
    return {
        "config": config_digest(
            cfg.model_dump(mode="json", exclude={"preset", "runs_dir", "data_dir"})
        )
    }


def _step_benchmark(ctx: DepthContext, state: PipelineState) -> None:
    from fathom.depthscale.config import scale_note
    from fathom.depthscale.runner import run_benchmark
    from fathom.depthscale.table import write_table

    def progress(event: str, info: dict[str, Any]) -> None:
        if event in ("skip", "end"):
            what = info.get("status")
            ctx.say(f"  {info['arm']:<8} depth {info['depth']:>2} seed {info['seed']}: {what}")

    def body() -> list[Path]:
        run_benchmark(ctx.cfg, ctx.root, progress=progress, workers=ctx.workers)
        write_table(ctx.root, scale_note(ctx.cfg))
        return [ctx.root / "table.json", ctx.root / "table.md"]

    run_step(ctx, state, "depth-scaling", _config_inputs(ctx.cfg), body)


def _devices(root: Path) -> list[str]:
    from fathom.rundir import RunDir

    return sorted(
        {
            RunDir(p).record.environment.device_name
            for p in sorted(root.iterdir())
            if (p / "manifest.json").exists()
        }
    )


def _fit_sizes(root: Path) -> list[int]:
    """The fitting-set sizes the benchmark's runs recorded (``data.sizes.fit``)."""
    from fathom.rundir import RunDir

    sizes = set()
    for p in sorted(root.iterdir()):
        if (p / "manifest.json").exists():
            sizes.add(RunDir(p).record.data.sizes.fit)
    return sorted(sizes)


def _step_compare(ctx: DepthContext, state: PipelineState) -> dict[str, Any]:
    """The comparison (written, or read back when the step is skipped)."""
    from fathom.depthscale.config import protocol_reductions
    from fathom.depthscale.table import build_table, read_runs, run_classes
    from fathom.reproduce.depth_compare import depth_comparison
    from fathom.reproduce.depth_render import to_markdown
    from fathom.reproduce.seeds import load_seeds

    seeds = load_seeds()
    inputs = {
        "table": state.output_digest("depth-scaling"),
        "seeds": config_digest(seeds.model_dump(mode="json")),
    }
    out = ctx.root / "reproduce"

    def body() -> list[Path]:
        classes, dataset = run_classes(ctx.root)
        table = build_table(read_runs(ctx.root), classes, dataset)
        result = depth_comparison(
            seeds,
            table,
            pipeline=ctx.name,
            reductions=protocol_reductions(ctx.cfg),
            counterpart=f"{ctx.root}/table.md and {out}/reproduction.md",
            devices=_devices(ctx.root),
            fit_sizes=_fit_sizes(ctx.root),
        )
        atomic_write_json(out / "reproduction.json", result)
        atomic_write_text(out / "reproduction.md", to_markdown(result))
        return [out / "reproduction.json", out / "reproduction.md"]

    run_step(ctx, state, "compare", inputs, body)
    return json.loads((out / "reproduction.json").read_text())


def reproduce_depth(ctx: DepthContext) -> dict[str, Any]:
    """Both steps under the pipeline lock; returns the comparison (``reproduction.json``)."""
    with pipeline_lock(ctx.root) as lock:
        state = open_state(ctx, lock)
        _step_benchmark(ctx, state)
        return _step_compare(ctx, state)
