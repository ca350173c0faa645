"""Reports: the self-contained HTML explorer, static figures and summary.md.

Reads run directories and analysis outputs only (see :mod:`fathom.report.build`).
"""

from fathom.report.build import ReportOutputs, build_report
from fathom.report.runs import RunData, load_runs

__all__ = ["ReportOutputs", "RunData", "build_report", "load_runs"]
