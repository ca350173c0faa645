"""``--cpu-durations=N``: the N tests that cost the most CPU time, and the suite's total.

Wall-clock durations (pytest's ``--durations``) measure the machine's load as much as the
tests; on a shared 2-core machine the CPU time a test costs is the stable figure. A test's
CPU time is ``process_time()`` of the process running it (all its threads) plus the user +
sys time of the child processes it reaped (``RUSAGE_CHILDREN``: subprocess CLIs, workers),
from the start of its setup to the end of its teardown, so a module- or session-scoped
fixture is charged to the first test that builds it. Works under pytest-xdist: each worker
measures its own tests and the figure travels to the controller on the teardown report.
"""

from __future__ import annotations

import resource
import time

import pytest

_STARTED: dict[str, float] = {}


def cpu_now() -> float:
    """CPU seconds so far: this process plus its reaped children (user + sys)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="show the N tests with the most CPU time (process + reaped children), and the total",
    )


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _STARTED[nodeid] = cpu_now()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and item.nodeid in _STARTED:
        report.cpu_s = cpu_now() - _STARTED.pop(item.nodeid)


class CpuDurations:
    """Collects ``cpu_s`` from the teardown reports (local or from xdist workers)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cpu: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        cpu = getattr(report, "cpu_s", None)
        if report.when == "teardown" and cpu is not None:
            self.cpu[report.nodeid] = float(cpu)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        tr.write_sep("=", f"slowest {self.n} tests by CPU time (process + children)")
        ranked = sorted(self.cpu.items(), key=lambda kv: kv[1], reverse=True)
        for nodeid, cpu in ranked[: self.n]:
            tr.write_line(f"{cpu:8.2f}s cpu  {nodeid}")
        tr.write_line(f"{sum(self.cpu.values()):8.2f}s cpu  total over {len(self.cpu)} tests")
        per_file: dict[str, float] = {}
        for nodeid, cpu in self.cpu.items():
            path = nodeid.split("::", 1)[0]
            per_file[path] = per_file.get(path, 0.0) + cpu
        tr.write_sep("-", f"the {self.n} test files with the most CPU time")
        for path, cpu in sorted(per_file.items(), key=lambda kv: kv[1], reverse=True)[: self.n]:
            tr.write_line(f"{cpu:8.2f}s cpu  {path}")


def pytest_configure(config: pytest.Config) -> None:
    n = config.getoption("--cpu-durations")
    if n:
        config.pluginmanager.register(CpuDurations(n), "fathom-cpu-durations")
