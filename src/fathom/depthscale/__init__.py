"""The depth-scaling benchmark: a plan of ordinary runs, its results table and verdict, CLI."""

from fathom.base.lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "fathom.depthscale.config": [
            "ARMS",
            "PRESETS",
            "QUICK",
            "DepthScaleConfig",
            "make_config",
            "plan_runs",
            "run_config",
        ],
        "fathom.depthscale.runner": ["run_benchmark"],
        "fathom.depthscale.table": [
            "ResultsTable",
            "RunRecord",
            "build_table",
            "read_run",
            "read_runs",
            "render_markdown",
            "verdict_table",
            "write_table",
        ],
    },
)
