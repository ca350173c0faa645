"""Exports: round trips through each target's own reader, with null / NaN / inf values,
float64 values, a missing epoch and a truncated history line; bad input and guards."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import pytest

from fathom.cli import main
from fathom.errors import FathomError
from fathom.export import export, verify
from fathom.export.common import flatten_row
from fathom.report.runs import load_runs
from synthetic_runs import write_study


@pytest.fixture
def study(tmp_path: Path) -> Path:
    root = tmp_path / "study"
    write_study(
        root,
        recipes=("residual",),
        seeds=(101,),
        epochs=(0, 1, 2),
        layers=3,
        classes=3,
        awkward=True,
    )
    return root


def test_flatten_row() -> None:
    values, skipped = flatten_row(
        {"epoch": 1, "a": None, "m": [[1, 2], [3, None]], "s": "text", "b": True}
    )
    assert values == {
        "epoch": 1,
        "a": None,
        "m/0/0": 1,
        "m/0/1": 2,
        "m/1/0": 3,
        "m/1/1": None,
        "b": True,
    }
    assert skipped == ["s"]


def test_jsonl_round_trip(study: Path) -> None:
    report = export(study, "jsonl")
    assert report.ok, report.lines()
    assert report.runs == 2 and report.rows == 3 + 4
    assert any("awkward-s7" in f and "line 5" in f for f in report.flagged)
    lines = [
        json.loads(x)
        for x in (study / "exports" / "jsonl" / "history.jsonl").read_text().splitlines()
    ]
    awk = [x for x in lines if x["run/run_id"] == "awkward-s7"]
    assert [x["epoch"] for x in awk] == [0, 1, 3, 4]  # epoch 2 missing, truncated line left out
    assert awk[1]["val/ce"] == "NaN" and awk[1]["probe/act/mean/blocks.0.res.branch"] == "Infinity"
    assert (
        awk[2]["probe/act/mean/blocks.0.res.branch"] == "-Infinity"
        and awk[2]["val/acc_pct"] is None
    )
    assert awk[3]["fit/ce"] == 0.1 + 1e-12 and awk[3]["param/disp/stem"] == 1e300
    assert awk[0]["run/flagged_lines"] == [5] and awk[0]["run/seed"] == 7
    assert awk[3]["diverged"] is False and awk[3]["note"] == "text"
    assert isinstance(awk[0]["split/val/confusion"], list)
    saved = json.loads((study / "exports" / "jsonl" / "verify.json").read_text())
    assert saved["ok"] and saved["values"] == report.values


def test_jsonl_verify_detects_tampering(study: Path) -> None:
    export(study, "jsonl")
    path = study / "exports" / "jsonl" / "history.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    row["val/acc_pct"] = row["val/acc_pct"] + 1e-13
    lines[1] = json.dumps(row)
    path.write_text("\n".join(lines[:-1]) + "\n")
    report = verify(study, "jsonl")
    assert not report.ok
    assert any("val/acc_pct" in m for m in report.mismatches)
    assert any("lines, expected" in m for m in report.mismatches)


def test_guards(study: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert export(study, "jsonl", out).ok
    assert export(study, "jsonl", out).ok  # the same export again is allowed
    other = tmp_path / "other"
    write_study(other, recipes=("plain",), seeds=(1,), epochs=(0, 1))
    with pytest.raises(FathomError, match="already holds a different export"):
        export(other, "jsonl", out)
    assert export(other, "jsonl", out, force=True).ok
    assert verify(other, "jsonl", out).ok
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for force in (False, True):
        with pytest.raises(FathomError, match="not a Fathom export"):
            export(study, "jsonl", foreign, force=force)
    assert (foreign / "notes.txt").read_text() == "mine"
    with pytest.raises(FathomError, match="no runs under"):
        export(tmp_path / "foreign", "jsonl", tmp_path / "x")
    with pytest.raises(FathomError, match="holds no Fathom export"):
        verify(study, "jsonl", tmp_path / "nothing")
    with pytest.raises(FathomError, match="pass --to jsonl"):
        verify(other, "tensorboard", out)


def test_verify_notices_changed_source(study: Path) -> None:
    export(study, "jsonl")
    hist = study / "residual-s101" / "history.jsonl"
    hist.write_text(hist.read_text() + json.dumps({"epoch": 9, "val/acc": 0.5}) + "\n")
    report = verify(study, "jsonl")
    assert any("changed since this export" in m for m in report.mismatches)


def test_tensorboard_round_trip(study: Path) -> None:
    pytest.importorskip("tensorboard", reason="install the tensorboard extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    report = export(study, "tensorboard")
    assert report.ok, report.lines()
    acc = EventAccumulator(
        str(study / "exports" / "tensorboard" / "awkward-s7"), size_guidance={"scalars": 0}
    )
    acc.Reload()
    ev = acc.Scalars("val/ce")
    assert [e.step for e in ev] == [0, 1, 3, 4] and math.isnan(ev[1].value)
    assert [e.step for e in acc.Scalars("val/acc_pct")] == [0, 1, 4]  # null at epoch 3 is a gap
    assert [e.value for e in acc.Scalars("probe/act/mean/blocks.0.res.branch")][1:3] == [
        math.inf,
        -math.inf,
    ]
    assert acc.Scalars("param/disp/stem")[-1].value == math.inf  # 1e300 does not fit float32
    elapsed = [e.value for e in acc.Scalars("clock/elapsed_s")]
    # the awkward run predates clock/unix_s: wall time falls back to Fathom's elapsed, said so
    assert [e.wall_time for e in ev] == pytest.approx(elapsed, rel=1e-6)
    assert any("predates clock/unix_s" in n and "awkward-s7" in n for n in report.notes)
    assert not any("split/val/confusion/" in t for t in acc.Tags()["scalars"])  # no 300 tags
    assert [e.value for e in acc.Scalars("diverged")] == [0.0]
    assert any("left out of tensorboard: ['note']" in n for n in report.notes)


def test_tensorboard_as_its_users_expect(study: Path) -> None:
    """Real wall times, a registry description on every tag, confusion as one exact tensor
    and an image per row, HParams per run, an experiment record and a layout at the root."""
    pytest.importorskip("tensorboard", reason="install the tensorboard extra")
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    from fathom.export import tensorboard_meta as meta

    assert export(study, "tensorboard").ok
    out = study / "exports" / "tensorboard"
    run = next(r for r in load_runs(study) if r.run_id == "residual-s101")
    sizes = {"scalars": 0, "tensors": 0, "images": 0}
    acc = EventAccumulator(str(out / "residual-s101"), size_guidance=sizes)
    acc.Reload()
    # wall time: the row's own Unix timestamp, not 1970 + elapsed
    walls = [e.wall_time for e in acc.Scalars("val/ce")]
    assert walls == pytest.approx([row["clock/unix_s"] for row in run.rows], rel=1e-12)
    assert min(walls) > 1e9
    # every scalar tag carries its definition
    for tag in acc.Tags()["scalars"]:
        text = acc.SummaryMetadata(tag).summary_description
        assert text == meta.description(tag) and len(text) > 20, tag
    assert "(1/N) Σ_i -log softmax" in acc.SummaryMetadata("val/ce").summary_description
    assert "percent" in acc.SummaryMetadata("val/acc_pct").summary_description
    # confusion: one float64 tensor per row, exactly the history's matrix, and an image
    got = acc.Tensors("split/val/confusion")
    want = [row["split/val/confusion"] for row in run.rows]
    assert [tensor_util.make_ndarray(e.tensor_proto).tolist() for e in got] == want
    images = acc.Images("split/val/confusion/image")
    assert len(images) == len(run.rows) and images[0].encoded_image_string[:4] == b"\x89PNG"
    assert images[0].width == images[0].height == 3 * 16
    # HParams: the config's leaves, and the selected/final metrics from the history
    content = acc.PluginTagToContent("hparams")[meta.SESSION_TAG]
    hp = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hp["model.recipe"].string_value == "residual" and hp["seed"].number_value == 101
    final = run.manifest["final"]["epoch"]
    last = next(r for r in run.rows if r["epoch"] == final)
    assert acc.Scalars("hparams/final/test/ce")[-1].value == pytest.approx(last["test/ce"], 1e-6)
    assert acc.Scalars("hparams/final/test/acc_pct")[-1].value == pytest.approx(
        100 * last["test/acc"], 1e-6
    )
    # the root: the experiment (every hyperparameter and metric) and the custom-scalars layout
    root = EventAccumulator(str(out), size_guidance=sizes)
    root.Reload()
    exp = plugin_data_pb2.HParamsPluginData.FromString(
        root.PluginTagToContent("hparams")[meta.EXPERIMENT_TAG]
    ).experiment
    assert "optim.lr" in {h.name for h in exp.hparam_infos}
    assert "hparams/selected/val/acc_pct" in {m.name.tag for m in exp.metric_infos}
    layout = layout_pb2.Layout.FromString(
        tensor_util.make_ndarray(root.Tensors("custom_scalars__config__")[0].tensor_proto).item()
    )
    assert [c.title for c in layout.category] == ["fit", "val", "test"]
    assert np.isfinite(walls).all()


@pytest.mark.parametrize(
    "damage", ["description", "matrix", "hparams", "layout", "wall"], ids=lambda d: f"damaged-{d}"
)
def test_tensorboard_verify_catches_each_damage(
    study: Path, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each new piece is read back: writing it wrong makes the verification fail, naming it."""
    pytest.importorskip("tensorboard", reason="install the tensorboard extra")
    from fathom.export import common, tensorboard_meta

    with monkeypatch.context() as m:
        if damage == "description":
            m.setattr(tensorboard_meta, "description", lambda tag: "wrong")
        elif damage == "matrix":
            m.setattr(tensorboard_meta, "matrix_array", lambda v: __import__("numpy").zeros((1, 1)))
        elif damage == "hparams":
            m.setattr(
                tensorboard_meta,
                "session_summary",
                lambda run: __import__(
                    "tensorboard.plugins.hparams.summary_v2", fromlist=["x"]
                ).hparams_pb({"seed": -1}, trial_id=run.run_id),
            )
        elif damage == "wall":  # 1970 + elapsed instead of the row's own timestamp
            m.setattr(common, "wall_time", lambda row, last: (0.0, False))
        else:
            m.setattr(
                tensorboard_meta,
                "layout_summary",
                lambda: (
                    __import__("tensorboard.compat.proto.summary_pb2", fromlist=["x"]).Summary(),
                    None,
                ),
            )
        export(study, "tensorboard")
    report = verify(study, "tensorboard")
    words = {
        "description": "registry description",
        "matrix": "matrix",
        "hparams": "HParams",
        "layout": "layout",
        "wall": "wall times",
    }
    assert not report.ok and any(words[damage] in x for x in report.mismatches), report.lines()


def test_tensorboard_verify_detects_extra_event(study: Path) -> None:
    pytest.importorskip("tensorboard", reason="install the tensorboard extra")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    export(study, "tensorboard")
    w = EventFileWriter(
        str(study / "exports" / "tensorboard" / "residual-s101"), filename_suffix=".extra"
    )
    w.add_event(
        Event(
            step=7,
            wall_time=1.0,
            summary=Summary(value=[Summary.Value(tag="val/acc_pct", simple_value=50.0)]),
        )
    )
    w.close()
    report = verify(study, "tensorboard")
    assert not report.ok and any("val/acc_pct: steps" in m for m in report.mismatches)


def test_wandb_round_trip(study: Path) -> None:
    pytest.importorskip("wandb", reason="install the wandb extra")
    from fathom.export.wandb_records import read_records

    report = export(study, "wandb")
    assert report.ok, report.lines()
    assert report.steps == 7 and report.values > 300
    record = json.loads((study / "exports" / "wandb" / "fathom-export.json").read_text())
    path = study / "exports" / "wandb" / record["wandb_files"]["awkward-s7"]
    hist = [r.history for r in read_records(path) if r.WhichOneof("record_type") == "history"]
    items = [
        {i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in h.item}
        for h in hist
    ]
    assert [x["_step"] for x in items] == [0, 1, 3, 4]
    assert math.isnan(items[1]["val/ce"]) and items[2]["val/acc_pct"] is None
    assert items[3]["fit/ce"] == 0.1 + 1e-12 and items[3]["param/disp/stem"] == 1e300
    assert "clock/training_s" in items[1] and "clock/elapsed_s" in items[1]
    assert items[3]["diverged"] is False and "note" not in items[3]
    again = verify(study, "wandb")
    assert again.ok and again.values == report.values


def test_wandb_dropped_step_is_caught(study: Path, tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="install the wandb extra")
    from fathom.export import wandb_export, wandb_verify
    from fathom.export.common import VerifyReport

    run = next(r for r in load_runs(study) if r.run_id == "residual-s101")
    run.rows = [run.rows[0], run.rows[2], run.rows[1]]  # epoch 1 after 2: W&B drops it
    out = tmp_path / "wb"
    out.mkdir()
    _, extra = wandb_export.write([run], out)
    report = VerifyReport("wandb", out)
    wandb_verify.verify([run], out, extra, report)
    # W&B drops the late row; the read-back reports the step sequence it kept. (What looked
    # like W&B losing a whole history after another run was the file read before W&B had
    # written it: the writer now waits for the exit record.)
    assert "run residual-s101: step sequence [0, 2] != epochs [0, 2, 1]" in report.mismatches


def test_wandb_record_reader_checks_crc(study: Path, tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="install the wandb extra")
    from fathom.export.wandb_records import read_payloads

    export(study, "wandb")
    record = json.loads((study / "exports" / "wandb" / "fathom-export.json").read_text())
    path = study / "exports" / "wandb" / record["wandb_files"]["residual-s101"]
    data = bytearray(path.read_bytes())
    assert data[:4] == b":W&B" and struct.unpack_from("<H", data, 4)[0] == 0xBEE1
    data[40] ^= 0xFF
    bad = tmp_path / "bad.wandb"
    bad.write_bytes(bytes(data))
    with pytest.raises(FathomError, match="corrupt record"):
        read_payloads(bad)
    assert verify(study, "wandb").ok


def test_wandb_file_without_its_exit_record_is_waited_for_then_refused(
    study: Path, tmp_path: Path
) -> None:
    """``finish()`` can return before W&B's service has written a run's last records (seen
    with two processes exporting on two busy cores: a clean cut with history and summary
    missing). The writer waits for the exit record; the read-back refuses a file without it."""
    pytest.importorskip("wandb", reason="install the wandb extra")
    import threading

    from fathom.export.wandb_records import is_complete, read_records, wait_complete

    export(study, "wandb")
    record = json.loads((study / "exports" / "wandb" / "fathom-export.json").read_text())
    path = study / "exports" / "wandb" / record["wandb_files"]["residual-s101"]
    whole = path.read_bytes()

    def clean_cut(n: int) -> bool:
        cut = tmp_path / "cut.wandb"
        cut.write_bytes(whole[:n])
        try:
            return not is_complete(read_records(cut))
        except FathomError:
            return False

    n = next(n for n in range(len(whole) - 1, 0, -1) if clean_cut(n))
    path.write_bytes(whole[:n])
    assert not wait_complete(path, timeout_s=0.05)
    report = verify(study, "wandb")
    assert not report.ok
    assert any("residual-s101" in m and "no exit record" in m for m in report.mismatches)
    later = threading.Timer(0.2, path.write_bytes, (whole,))  # the service finishing late
    later.start()
    assert wait_complete(path, timeout_s=30)
    later.join()
    assert verify(study, "wandb").ok


@pytest.mark.parametrize(("target", "module"), [("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_missing_extra_names_it(
    study: Path, monkeypatch: pytest.MonkeyPatch, target: str, module: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(FathomError, match=rf"\.\[{target}\]"):
        export(study, target)


def test_cli_export(study: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["export", str(study), "--to", "jsonl"]) == 0
    out = capsys.readouterr().out
    assert "verified by reading back 2 runs, 7 history rows" in out and "flagged: awkward-s7" in out
    assert main(["export", str(study), "--to", "jsonl", "--verify-only"]) == 0
    (study / "exports" / "jsonl" / "history.jsonl").write_text("")
    assert main(["export", str(study), "--to", "jsonl", "--verify-only"]) == 1
    assert "mismatch" in capsys.readouterr().out
