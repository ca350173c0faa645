"""An incomplete run (``running`` with no live writer, i.e. interrupted; ``failed``;
``diverged``) is named, with its status, in every report and export output beside the
complete ones, never omitted; a run without its final result is said to be unfinished
first, with the command that continues it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fathom.export.run import export
from fathom.report.build import build_report
from synthetic_runs import synthetic_history, write_run

INCOMPLETE = {
    "main-plain-s2": "running",
    "main-residual-s2": "failed",
    "main-residual-s3": "diverged",
}
SAID = {**INCOMPLETE, "main-plain-s2": "interrupted"}
"""The status every output says: a ``running`` manifest whose run no process holds was
interrupted without recording it (:func:`fathom.rundir.run_state`)."""


def _study(root: Path) -> Path:
    for recipe in ("plain", "residual"):
        for seed in (1, 2, 3):
            run_id = f"main-{recipe}-s{seed}"
            status = INCOMPLETE.get(run_id, "complete")
            epochs = [0, 1, 2] if status == "complete" else [0, 1]
            rows = synthetic_history(seed, epochs)
            write_run(
                root / run_id, study="s", recipe=recipe, seed=seed, lr=0.1, rows=rows, status=status
            )
    return root


def test_an_incomplete_run_is_named_with_its_status_in_the_report(tmp_path: Path) -> None:
    out = build_report(_study(tmp_path / "s"), with_figures=False)
    assert out.runs == 6
    summary, html = out.summary_md.read_text(), out.html.read_text()
    for run_id, status in SAID.items():
        lines = [line for line in summary.splitlines() if run_id in line]
        assert any(f"| {status}" in line for line in lines), (run_id, lines)
        assert run_id in html
    resume = f"continue with `fathom train --resume {tmp_path / 's' / 'main-plain-s2'}`"
    assert out.unfinished == [next(x for x in out.unfinished if resume in x)]
    assert summary.splitlines()[2].startswith("> **Not finished**: main-plain-s2: interrupted")
    assert "NOT FINISHED: main-plain-s2: interrupted" in html


@pytest.mark.parametrize("target", ["jsonl", "tensorboard"])
def test_an_incomplete_run_is_named_with_its_status_in_every_export(
    tmp_path: Path, target: str
) -> None:
    root = _study(tmp_path / "s")
    report = export(root, target)
    assert "verified" in report.lines()[0] and "6 runs" in report.lines()[0]
    record = json.loads((root / "exports" / target / "fathom-export.json").read_text())
    assert report.lines()[1].startswith("not finished: main-plain-s2: interrupted, ")
    assert record["unfinished"] == [report.lines()[1].removeprefix("not finished: ")]
    for run_id, status in SAID.items():
        assert record["runs"][run_id]["status"] == status
        assert record["runs"][run_id]["epochs"] == [0, 1]
