"""Reports: the self-contained HTML explorer, static figures and summary.md.

Reads run directories and analysis outputs only (see :mod:`fathom.report.build`).
"""

from fathom.base.lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "fathom.report.build": ["ReportOutputs", "build_report"],
        "fathom.report.runs": ["RunData", "load_runs"],
    },
)
