"""Report and export name every damaged run in every output: a deleted, emptied, torn,
edited or duplicated history is listed with its problem, never left out or read around."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fathom.export.run import export
from fathom.report.build import build_report
from synthetic_runs import synthetic_history, write_run

RUN = "main-plain-s2"


def _study(root: Path) -> Path:
    for recipe in ("plain", "residual"):
        for seed in (1, 2):
            write_run(
                root / f"main-{recipe}-s{seed}",
                study="s",
                recipe=recipe,
                seed=seed,
                lr=0.1,
                rows=synthetic_history(seed, [0, 1, 2]),
            )
    return root


def _damage(path: Path, how: str) -> str:
    """Damage ``history.jsonl``; return the problem the reader must name."""
    lines = path.read_text().splitlines(keepends=True)
    if how == "deleted":
        path.unlink()
        return "history.jsonl is missing"
    if how == "emptied":
        path.write_text("")
        return "history.jsonl is shorter than its writer recorded"
    if how == "middle line deleted":
        path.write_text(lines[0] + lines[2])
        return "history.jsonl is shorter than its writer recorded"
    if how == "value changed":
        i = lines[1].index('"test/acc": ') + len('"test/acc": 0.')  # same length, other value
        digit = "1" if lines[1][i] != "1" else "2"
        path.write_text(lines[0] + lines[1][:i] + digit + lines[1][i + 1 :] + lines[2])
        return "history.jsonl fails its digest check"
    if how == "row duplicated":
        path.write_text("".join(lines) + lines[1])
        return "history repeats epoch 1"
    path.write_text("".join(lines)[:-10])  # torn last line
    return "history line 3 is truncated or does not parse"


@pytest.mark.parametrize(
    "how",
    ["deleted", "emptied", "middle line deleted", "value changed", "row duplicated", "torn"],
)
def test_a_damaged_history_is_named_in_every_output(tmp_path: Path, how: str) -> None:
    root = _study(tmp_path / "s")
    problem = _damage(root / RUN / "history.jsonl", how)
    out = build_report(root, with_figures=False)
    assert out.runs == 4
    assert any(f.startswith(f"{RUN}: ") and problem in f for f in out.flagged), out.flagged
    summary = out.summary_md.read_text()
    assert RUN in summary and problem in summary
    assert "verified intact" not in summary
    assert problem in out.html.read_text()
    for target in ("jsonl", "tensorboard"):
        report = export(root, target)
        assert any(f.startswith(f"{RUN}: ") and problem in f for f in report.flagged)
        assert any(RUN in line and problem in line for line in report.lines())
        record = json.loads((root / "exports" / target / "fathom-export.json").read_text())
        assert RUN in json.dumps(record)
