"""Export backends are one table (``fathom.config_export.EXPORT_TARGETS``) of modules
implementing ``fathom.export.backend``'s Protocols: a backend registered by one entry is
used by ``fathom export`` and by live tracking, and every name list derives from the table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import export_dummy
from conftest import tiny_config
from fathom.cli import build_parser, main
from fathom.config import validate_run_config
from fathom.config_export import EXPORT_TARGETS, ExportTarget, export_targets, live_targets
from fathom.errors import FathomError
from fathom.export.backend import ExportBackend, LiveBackend, LiveSink, backend
from fathom.export.live import LiveTracker, parse_live
from fathom.io import read_jsonl
from fathom.train.loop import train
from test_export import write_study  # wherever the synthetic run fixtures live

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reports.md"


@pytest.fixture
def dummy(monkeypatch: pytest.MonkeyPatch) -> str:
    """The one table entry that registers ``tests/export_dummy.py``."""
    monkeypatch.setitem(
        EXPORT_TARGETS, "dummy", ExportTarget("export_dummy", live=True, numbers_only=False)
    )
    monkeypatch.setattr(export_dummy, "OPENED", [])
    return "dummy"


def test_every_registered_backend_implements_its_protocols() -> None:
    for name, entry in EXPORT_TARGETS.items():
        b = backend(name)
        assert isinstance(b, ExportBackend), name
        assert isinstance(b, LiveBackend) == entry.live, name
    assert export_targets() == ("jsonl", "wandb", "tensorboard")
    assert live_targets() == ("wandb", "tensorboard")


def test_a_backend_that_is_not_one_is_refused_naming_it(monkeypatch) -> None:
    monkeypatch.setitem(EXPORT_TARGETS, "half", ExportTarget("export_dummy", live=False))
    assert isinstance(backend("half"), ExportBackend)  # a live backend may export only
    monkeypatch.setitem(EXPORT_TARGETS, "bad", ExportTarget("fathom.errors", live=True))
    with pytest.raises(FathomError, match="'bad': module fathom.errors is not a LiveBackend"):
        backend("bad")
    with pytest.raises(FathomError, match="unknown export target 'nope'; use one of: jsonl"):
        backend("nope")


def test_a_dummy_backend_is_used_by_fathom_export(dummy, tmp_path: Path, capsys) -> None:
    study = tmp_path / "study"  # the fixture of test_export: two runs, one with awkward values
    write_study(study, recipes=("residual",), seeds=(101,), epochs=(0, 1, 2), awkward=True)
    assert main(["export", str(study), "--to", dummy]) == 0
    assert "verified by reading back 2 runs" in capsys.readouterr().out
    out = study / "exports" / dummy
    record = json.loads((out / "fathom-export.json").read_text())
    assert record["target"] == dummy and record["dummy_runs"] == 2
    verified = json.loads((out / "verify.json").read_text())
    assert verified["ok"] and not any("not numbers" in n for n in verified["notes"])
    assert main(["export", str(study), "--to", dummy, "--verify-only"]) == 0
    first = sorted(out.glob("*.json"))[0]
    first.write_text("[]")  # damaged: the backend's own read-back notices
    assert main(["export", str(study), "--to", dummy, "--verify-only"]) == 1
    assert "differs from the history" in capsys.readouterr().out


def test_a_dummy_backend_is_used_by_live_tracking(dummy, tmp_path: Path, splits) -> None:
    cfg = tiny_config()
    assert validate_run_config({"live": {"backends": [dummy]}}).live.backends == (dummy,)
    assert parse_live(f"tensorboard,{dummy}") == ("tensorboard", dummy)
    tracker = LiveTracker(tmp_path / "run", [dummy], cfg)
    train(cfg, tmp_path / "run", splits=splits, progress=tracker)
    (report,) = tracker.close()
    assert report.ok and report.target == f"live {dummy}", report.mismatches
    live = tmp_path / "run" / "live" / dummy
    assert [live] == export_dummy.OPENED
    rows, _ = read_jsonl(tmp_path / "run" / "history.jsonl")
    streamed = json.loads((live / export_dummy.LIVE_FILE).read_text())
    assert [r["epoch"] for r in streamed] == [r["epoch"] for r in rows]
    assert json.loads((live / "fathom-export.json").read_text())["dummy_rows"] == len(rows)


def test_the_cli_and_config_offer_exactly_the_table(dummy) -> None:
    choices = {
        a.dest: a.choices
        for a in build_parser("export")._subparsers._group_actions[0].choices["export"]._actions
    }
    assert tuple(choices["to"]) == export_targets() and dummy in choices["to"]
    train = build_parser("train")._subparsers._group_actions[0].choices["train"]
    (live_help,) = [a.help for a in train._actions if a.dest == "live"]
    assert all(name in live_help for name in live_targets()) and dummy in live_help
    with pytest.raises(FathomError, match="is not a live backend"):
        validate_run_config({"live": {"backends": ["jsonl"]}})  # a target, but not live
    with pytest.raises(FathomError, match="unknown live target"):
        parse_live("jsonl")


def test_the_docs_name_exactly_the_table() -> None:
    """docs/reports.md's export heading lists every target; its live heading every live one."""
    text = DOCS.read_text()
    heading = re.search(r"## `fathom export DIR --to ([a-z|]+)", text)
    assert heading and tuple(heading.group(1).split("|")) == export_targets()
    live = re.search(r"## Live tracking: `fathom train \.\.\. --live ([a-z,]+)`", text)
    assert live and sorted(live.group(1).split(",")) == sorted(live_targets())


def test_the_live_sinks_are_live_sinks() -> None:
    from fathom.export.tensorboard_export import TensorBoardSink
    from fathom.export.wandb_export import WandbSink

    for cls in (TensorBoardSink, WandbSink, export_dummy.DummySink):
        assert all(callable(getattr(cls, m, None)) for m in ("write", "close", "verify"))
    assert isinstance(export_dummy.DummySink(Path(".")), LiveSink)
