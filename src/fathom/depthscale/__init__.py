"""The depth-scaling benchmark: a plan of ordinary runs, its results table and verdict, CLI."""

from fathom.depthscale.config import (
    ARMS,
    PRESETS,
    QUICK,
    DepthScaleConfig,
    make_config,
    plan_runs,
    run_config,
)
from fathom.depthscale.runner import run_benchmark
from fathom.depthscale.table import (
    ResultsTable,
    RunRecord,
    build_table,
    read_run,
    read_runs,
    render_markdown,
    verdict_table,
    write_table,
)

__all__ = [
    "ARMS",
    "PRESETS",
    "QUICK",
    "DepthScaleConfig",
    "ResultsTable",
    "RunRecord",
    "build_table",
    "make_config",
    "plan_runs",
    "read_run",
    "read_runs",
    "render_markdown",
    "run_benchmark",
    "run_config",
    "verdict_table",
    "write_table",
]
