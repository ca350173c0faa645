"""The synthetic run fixtures: runs are written by the one writer and read back verified; the
legacy writer gives a format-2 manifest with the cases no writer produces."""

from __future__ import annotations

import json
import math

from fathom.rundir import RunDir, RunManifest
from fathom.rundir.header import FORMAT
from synthetic_runs import awkward_rows, synthetic_history, write_legacy_run, write_run


def test_a_synthetic_run_is_a_typed_verified_run_directory(tmp_path):
    rows = synthetic_history(3, [0, 1, 2], layers=3, classes=3)
    path = write_run(tmp_path / "r", study="s", recipe="residual", seed=3, lr=0.1, rows=rows)
    rd = RunDir(path)
    assert isinstance(rd.header, RunManifest) and rd.manifest["format"] == FORMAT
    assert rd.problems() == [] and rd.history() == rows
    again = write_run(path, study="s", recipe="plain", seed=3, lr=0.1, rows=rows[:1])
    assert RunDir(again).history() == rows[:1]  # replaced, not refused


def test_the_legacy_run_keeps_what_the_writer_never_writes(tmp_path):
    path = write_legacy_run(
        tmp_path / "old", study="s", recipe="plain", seed=7, lr=0.03, rows=awkward_rows(7),
        truncated_tail=True,
    )  # fmt: skip
    rd = RunDir(path)
    assert rd.manifest["format"] == 2 and not isinstance(rd.header, RunManifest)
    lines = (path / "history.jsonl").read_text().splitlines()
    assert math.isnan(json.loads(lines[1])["val/ce"])  # a NaN literal, as json.dumps wrote it
    assert "history.jsonl line 5 is torn (truncated or unparsable)" in rd.problems()
