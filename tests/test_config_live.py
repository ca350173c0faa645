"""The ``[live]`` config section: validated, overridden by ``--live``, recorded in the manifest,
and never part of the training config: same ``config_hash``, same trained bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import tiny_config
from fathom.base.io import config_digest
from fathom.config import RunConfig, validate_run_config
from fathom.config.live import LiveConfig
from fathom.errors import FathomError
from fathom.export.live import LiveTracker
from fathom.study.config import validate_study_config
from fathom.train.cli import live_settings
from fathom.train.loop import train
from test_study import study_data

LIVE = {
    "backends": ["tensorboard"],
    "wandb": {"project": "proj", "entity": "team", "mode": "offline"},
    "tensorboard": {"log_dir": "tb"},
}


def test_live_is_validated_with_clear_errors() -> None:
    cfg = validate_run_config({"live": LIVE})
    assert cfg.live.backends == ("tensorboard",) and cfg.live.wandb.project == "proj"
    assert RunConfig().live == LiveConfig() and not RunConfig().live.enabled
    bad = {
        "backends": (["mlflow"], "live.backends.0"),
        "wandb": ({"mode": "cloud"}, "live.wandb.mode"),
        "tensorboard": ({"logdir": "x"}, "unknown key 'live.tensorboard.logdir'"),
    }
    for key, (value, text) in bad.items():
        with pytest.raises(FathomError, match=text.replace(".", r"\.")):
            validate_run_config({"live": {key: value}})
    with pytest.raises(FathomError, match="lists a backend twice"):
        validate_run_config({"live": {"backends": ["wandb", "wandb"]}})
    with pytest.raises(FathomError, match="is not a W&B name"):
        validate_run_config({"live": {"wandb": {"project": "a/b"}}})
    with pytest.raises(FathomError, match="unknown key 'live.flush_secs'"):
        validate_run_config({"live": {"flush_secs": 5}})


def test_live_is_not_part_of_the_training_config() -> None:
    plain, tracked = RunConfig(), validate_run_config({"live": LIVE})
    assert "live" not in tracked.model_dump() and "live" not in tracked.model_dump(mode="json")
    assert config_digest(plain.model_dump(mode="json")) == config_digest(
        tracked.model_dump(mode="json")
    )
    updated = tracked.with_updates({"optim.lr": 0.03})  # a copy keeps its live settings
    assert updated.live == tracked.live and updated.optim.lr == 0.03
    assert plain.with_updates({"live.backends": ["wandb"]}).live.backends == ("wandb",)


def test_the_flag_overrides_the_backends_only() -> None:
    configured = LiveConfig.model_validate(LIVE)
    assert live_settings(configured, None) == configured
    both = live_settings(configured, "wandb,tensorboard")
    assert both.backends == ("wandb", "tensorboard") and both.wandb == configured.wandb
    assert not live_settings(configured, "off").enabled
    with pytest.raises(FathomError, match="unknown live target"):
        live_settings(configured, "mlflow")


def test_study_live_section() -> None:
    study = validate_study_config({**study_data(), "live": LIVE}, "s")
    assert study.live.backends == ("tensorboard",)
    plain = validate_study_config(study_data(), "s")
    assert "live" not in study.to_data() and study.to_data() == plain.to_data()
    data = study_data()
    data["base"] = {**data["base"], "live": {"backends": ["wandb"]}}
    with pytest.raises(FathomError, match=r"\[base\.live\].*top-level \[live\]"):
        validate_study_config(data, "s")


def test_same_hash_and_bytes_with_and_without_live_and_recorded(tmp_path: Path, splits) -> None:
    """Shared log_dir placement; the manifest records the settings; training is unchanged."""
    live = LiveConfig.model_validate({**LIVE, "tensorboard": {"log_dir": str(tmp_path / "tb")}})
    cfg = tiny_config()
    off = train(cfg, tmp_path / "off", splits=splits)
    tracked = cfg.model_copy(update={"live": live})
    tracker = LiveTracker(tmp_path / "on", tracked.live, tracked)
    on = train(tracked, tmp_path / "on", splits=splits, progress=tracker)
    (report,) = tracker.close()
    assert report.ok, report.mismatches
    m_on, m_off = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("on", "off"))
    assert m_on["config_hash"] == m_off["config_hash"] and m_on["config"] == m_off["config"]
    assert on.final_params == off.final_params and m_on["hashes"] == m_off["hashes"]
    assert m_on["live"] == live.model_dump(mode="json") and m_off["live"]["backends"] == []
    events = tmp_path / "tb" / "test" / "on"
    assert any(events.glob("events.out.tfevents.*")) and (events / "verify.json").exists()
    assert not (tmp_path / "on" / "live").exists()


def test_shared_log_dir_never_replaces_what_is_not_this_runs(tmp_path: Path) -> None:
    live = LiveConfig.model_validate(
        {"backends": ["tensorboard"], "tensorboard": {"log_dir": str(tmp_path / "tb")}}
    )
    foreign = tmp_path / "tb" / "test" / "tiny"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FathomError, match="not a Fathom live log"):
        LiveTracker(tmp_path / "tiny", live, tiny_config())
    (foreign / "notes.txt").unlink()
    (foreign / "fathom-live.json").write_text(json.dumps({"run_dir": "/elsewhere/tiny"}))
    with pytest.raises(FathomError, match="the live log of /elsewhere/tiny"):
        LiveTracker(tmp_path / "tiny", live, tiny_config())


def test_cli_config_section_and_flag(tmp_path: Path, capsys) -> None:
    from fathom.cli import main

    cfg = tmp_path / "cfg.toml"
    cfg.write_text(
        'name = "r"\nstudy = "s"\ndevice = "cpu"\n[data]\nfit_subset = 256\neval_subset = 64\n'
        "[model]\nwidths = [16, 12, 10, 8, 8]\n[optim]\nepochs = 2\nbatch_size = 64\n"
        '[live]\nbackends = ["tensorboard"]\n'
    )
    assert main(["train", str(cfg), "--runs-dir", str(tmp_path), "--quiet"]) == 0
    run = tmp_path / "s" / "r"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["live"]["backends"] == ["tensorboard"]
    assert json.loads((run / "live" / "tensorboard" / "verify.json").read_text())["ok"]
    args = ["train", str(cfg), "--runs-dir", str(tmp_path / "b"), "--quiet", "--live", "off"]
    assert main(args) == 0
    other = json.loads((tmp_path / "b" / "s" / "r" / "manifest.json").read_text())
    assert other["live"]["backends"] == [] and other["config_hash"] == manifest["config_hash"]
    assert not (tmp_path / "b" / "s" / "r" / "live").exists()
    assert "verified by reading back" in capsys.readouterr().out
    assert main(["validate", str(cfg)]) == 0
    shown = capsys.readouterr().out
    assert '"live"' in shown and '"tensorboard"' in shown


def test_resume_keeps_the_recorded_live_settings(tmp_path: Path, splits, monkeypatch) -> None:
    from fathom.cli import main
    from fathom.train.cli import recorded_live

    live = LiveConfig.model_validate({"backends": ["tensorboard"]})
    cfg = tiny_config().model_copy(update={"live": live})

    def stop(event, info):
        if event == "epoch_end" and info["epoch"] == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "tiny", splits=splits, progress=stop)
    assert recorded_live(tmp_path / "tiny") == live
    import fathom.train.loop as loop

    real = loop.train
    monkeypatch.setattr(loop, "train", lambda c, d, **kw: real(c, d, **{**kw, "splits": splits}))
    assert main(["train", "--resume", str(tmp_path / "tiny"), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "tiny" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["live"] == live.model_dump(mode="json")
    verify = json.loads((tmp_path / "tiny" / "live" / "tensorboard" / "verify.json").read_text())
    assert verify["ok"] and verify["rows"] == 4  # epochs 0-3, the earlier rows streamed again


def test_study_live_reaches_every_run_and_its_manifest(tmp_path: Path) -> None:
    from fathom.study.backends import LocalBackend
    from fathom.study.runner import run_study
    from test_study import synthetic_splits

    data = study_data(tuning={"enabled": False}, study={"lr": 0.05, "seeds": [101]})
    study = validate_study_config({**data, "live": {"backends": ["tensorboard"]}}, "live")
    result = run_study(
        study, tmp_path, LocalBackend(1, 1, synthetic_splits, live=study.live, tracker=LiveTracker)
    )
    assert all(o.error is None for o in result.outcomes) and result.outcomes
    for o in result.outcomes:
        run = tmp_path / "t" / o.run_id
        assert json.loads((run / "manifest.json").read_text())["live"]["backends"] == [
            "tensorboard"
        ]
        assert json.loads((run / "live" / "tensorboard" / "verify.json").read_text())["ok"]


def test_wandb_placement_reaches_the_run_record(tmp_path: Path, splits) -> None:
    pytest.importorskip("wandb")
    from fathom.export.wandb_records import read_records

    live = LiveConfig.model_validate({"backends": ["wandb"], "wandb": {"project": "proj"}})
    cfg = tiny_config(**{"optim.epochs": 1}).model_copy(update={"live": live})
    tracker = LiveTracker(tmp_path / "w", live, cfg)
    train(cfg, tmp_path / "w", splits=splits, progress=tracker)
    (report,) = tracker.close()
    assert report.ok, report.mismatches
    out = tmp_path / "w" / "live" / "wandb"
    rel = json.loads((out / "fathom-export.json").read_text())["wandb_files"]["w"]
    runs = [r.run for r in read_records(out / rel) if r.WhichOneof("record_type") == "run"]
    assert runs and runs[0].project == "proj" and runs[0].run_id == "w"
