"""The depth-scaling benchmark: runner, results table, computed verdict, CLI."""

from fathom.depthscale.config import PRESETS, QUICK, DepthScaleConfig, make_config
from fathom.depthscale.runner import ARMS, run_benchmark, train_run
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
    "read_run",
    "read_runs",
    "render_markdown",
    "run_benchmark",
    "train_run",
    "verdict_table",
    "write_table",
]
