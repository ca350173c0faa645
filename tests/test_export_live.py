"""Live tracking: the same rows as history.jsonl reach TensorBoard and W&B while training,
and the trained bytes and clocks-excluded histories do not change."""

from __future__ import annotations

import json

import pytest

from conftest import tiny_config
from fathom.base.io import read_jsonl
from fathom.errors import FathomError
from fathom.export.live import LiveTracker, fan_out, parse_live
from fathom.report.runs import load_runs
from fathom.train.loop import train


def _no_clocks(rows):
    return [{k: v for k, v in r.items() if not k.startswith("clock/")} for r in rows]


def test_live_on_and_off_train_the_same_bytes_and_stream_every_row(tmp_path, splits):
    cfg = tiny_config(**{"model.recipe": "sd_constant"})
    off = train(cfg, tmp_path / "off", splits=splits)
    tracker = LiveTracker(tmp_path / "on", ["tensorboard", "wandb"], cfg)
    seen = []

    def during(event, info):  # runs after the tracker on every event: rows already streamed
        if event == "epoch":
            rows, _ = read_jsonl(tmp_path / "on" / "history.jsonl")
            seen.append((len(rows), tracker.rows))

    on = train(cfg, tmp_path / "on", splits=splits, progress=fan_out(tracker, during))
    reports = tracker.close()
    assert on.final_params == off.final_params
    m_on = json.loads((tmp_path / "on" / "manifest.json").read_text())
    m_off = json.loads((tmp_path / "off" / "manifest.json").read_text())
    assert m_on["hashes"] == m_off["hashes"]
    h_on, _ = read_jsonl(tmp_path / "on" / "history.jsonl")
    h_off, _ = read_jsonl(tmp_path / "off" / "history.jsonl")
    assert _no_clocks(h_on) == _no_clocks(h_off)
    # streamed while training: at every epoch event the logs already held every row on disk
    assert seen and all(n_file == n_live for n_file, n_live in seen)
    assert [r.target for r in reports] == ["live tensorboard", "live wandb"]
    for r in reports:
        assert r.ok, r.mismatches
        assert r.runs == 1 and r.steps >= len(h_on)
    assert any((tmp_path / "on" / "live" / "tensorboard" / "on").glob("events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "on" / "live" / "tensorboard" / "on"))
    acc.Reload()  # accuracy streamed in percent, as the exports write it
    streamed = {e.step: e.value for e in acc.Scalars("val/acc_pct")}
    expected = {r["epoch"]: 100.0 * r["val/acc"] for r in h_on if r.get("val/acc") is not None}
    assert streamed == pytest.approx(expected, rel=1e-6) and "val/acc" not in acc.Tags()["scalars"]
    record = json.loads((tmp_path / "on" / "live" / "wandb" / "fathom-export.json").read_text())
    assert (tmp_path / "on" / "live" / "wandb" / record["wandb_files"]["on"]).exists()
    # the run directory still reads as one run (the live logs hold no manifest)
    assert [r.run_id for r in load_runs(tmp_path / "on")] == ["on"]


def test_live_logs_hold_the_divergence_row(tmp_path, splits):
    cfg = tiny_config(**{"optim.lr": 1e6, "model.recipe": "plain"})
    tracker = LiveTracker(tmp_path / "d", ["tensorboard"])
    res = train(cfg, tmp_path / "d", splits=splits, progress=tracker)
    (report,) = tracker.close()
    assert res.status == "diverged"
    rows, _ = read_jsonl(tmp_path / "d" / "history.jsonl")
    assert rows[-1].get("diverged") is True
    assert report.ok, report.mismatches
    assert tracker.rows == len(rows)


def test_read_back_catches_a_log_that_differs(tmp_path, splits):
    from fathom.export.common import VerifyReport
    from fathom.export.tensorboard_export import verify

    tracker = LiveTracker(tmp_path / "r", ["tensorboard"])
    train(tiny_config(), tmp_path / "r", splits=splits, progress=tracker)
    assert tracker.close()[0].ok
    run = load_runs(tmp_path / "r")[0]
    run.rows[-1] = {**run.rows[-1], "val/acc": 0.123456}
    report = VerifyReport("tensorboard", tmp_path)
    verify([run], tmp_path / "r" / "live" / "tensorboard", report)
    assert not report.ok and any("val/acc" in m for m in report.mismatches)


def test_a_failing_log_never_stops_training(tmp_path, splits):
    tracker = LiveTracker(tmp_path / "f", ["tensorboard"])

    def broken(row, values):
        raise OSError("disk full")

    def progress(event, info):
        if tracker.sinks:
            tracker.sinks["tensorboard"].write = broken
        tracker(event, info)

    res = train(tiny_config(), tmp_path / "f", splits=splits, progress=progress)
    assert res.status == "complete"
    (report,) = tracker.close()
    assert not report.ok and "disk full" in report.mismatches[0]


def test_parse_live_and_fan_out():
    assert parse_live(None) == () and parse_live("") == ()
    assert parse_live("tensorboard, wandb,tensorboard") == ("tensorboard", "wandb")
    with pytest.raises(FathomError, match="unknown live target"):
        parse_live("mlflow")
    calls = []
    both = fan_out(None, lambda e, i: calls.append(("a", e)), lambda e, i: calls.append(("b", e)))
    both("epoch", {})
    assert calls == [("a", "epoch"), ("b", "epoch")]
    assert fan_out(None, None) is None


def test_cli_train_live_tensorboard(tmp_path, capsys):
    from fathom.cli import main

    cfg = tmp_path / "cfg.toml"
    cfg.write_text(
        'name = "live"\nstudy = "s"\ndevice = "cpu"\n[data]\nfit_subset = 512\neval_subset = 128\n'
        "[model]\nwidths = [32, 24, 16, 12, 8]\n[optim]\nepochs = 2\nbatch_size = 64\n"
    )
    rc = main(["train", str(cfg), "--runs-dir", str(tmp_path), "--quiet", "--live", "tensorboard"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "live tensorboard export at" in out and "verified by reading back" in out
    assert (tmp_path / "s" / "live" / "live" / "tensorboard" / "verify.json").exists()
    assert main(["train", str(cfg), "--runs-dir", str(tmp_path / "x"), "--live", "mlflow"]) == 2


def test_study_runs_stream_live_with_the_same_hashes(tmp_path):
    from fathom.study.backends import LocalBackend
    from fathom.study.config import validate_study_config
    from fathom.study.runner import run_study
    from test_study import study_data, synthetic_splits

    study = validate_study_config(
        study_data(tuning={"enabled": False}, study={"lr": 0.05, "seeds": [101]}), "live"
    )
    plain = run_study(study, tmp_path / "a", LocalBackend(1, 1, synthetic_splits))
    live = run_study(
        study,
        tmp_path / "b",
        LocalBackend(1, 1, synthetic_splits, live=("tensorboard",), tracker=LiveTracker),
    )
    hashes = {k: v["final_params"] for k, v in plain.summary["runs"].items()}
    assert hashes == {k: v["final_params"] for k, v in live.summary["runs"].items()}
    assert all(o.error is None for o in live.outcomes)
    for o in live.outcomes:
        verify = json.loads(
            (tmp_path / "b" / "t" / o.run_id / "live" / "tensorboard" / "verify.json").read_text()
        )
        assert verify["ok"] and verify["rows"] > 0
    assert not any((tmp_path / "a" / "t").glob("*/live"))


def test_study_live_settings_without_a_tracker_are_refused(tmp_path):
    """The study layer never imports the exports: live settings need the tracker passed in."""
    from fathom.errors import FathomError
    from fathom.study.backends import LocalBackend
    from fathom.study.config import validate_study_config
    from fathom.study.runner import run_study
    from test_study import study_data, synthetic_splits

    study = validate_study_config(
        study_data(tuning={"enabled": False}, study={"lr": 0.05, "seeds": [101]}), "live"
    )
    with pytest.raises(FathomError, match="tracker=fathom.export.live.LiveTracker"):
        run_study(
            study, tmp_path / "c", LocalBackend(1, 1, synthetic_splits, live=("tensorboard",))
        )
