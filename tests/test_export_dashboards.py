"""What a dashboard user reads: W&B rows at their own time, a nested config, tags, group, job
type, confusion tables and checkpoint artifacts; TensorBoard HParams as trained and the runs'
curvature and audit results. Everything is read back with the target's own reader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fathom.errors import FathomError
from fathom.export import export, verify
from fathom.export.describe import NOT_HYPERPARAMETERS, as_trained, hparams, run_tags
from fathom.report.runs import RunData, load_runs
from synthetic_runs import write_run, write_study


@pytest.fixture
def study(tmp_path: Path) -> Path:
    root = tmp_path / "study"
    write_study(root, recipes=("residual",), seeds=(101,), epochs=(0, 1, 2), layers=3, classes=3)
    return root


def _wandb_read(out: Path, run_id: str):
    from fathom.export.wandb_records import WandbRun, read_records

    record = json.loads((out / "fathom-export.json").read_text())
    path = out / record["wandb_files"][run_id]
    return WandbRun(read_records(path)), path


# -- W&B ------------------------------------------------------------------------------------
def test_wandb_reads_as_its_users_expect(study: Path) -> None:
    pytest.importorskip("wandb", reason="install the wandb extra")
    report = export(study, "wandb")
    assert report.ok, report.lines()
    run = load_runs(study)[0]
    got, path = _wandb_read(study / "exports" / "wandb", run.run_id)
    # every row at its own Unix time, not the export's
    stamps = [items["_timestamp"] for _, items in got.history]
    assert stamps == [row["clock/unix_s"] for row in run.rows]
    # the config nested as the run's config is, the provenance beside it
    assert got.config["model"]["recipe"] == "residual" and got.config["optim"]["lr"] == 0.01
    assert got.config["fathom"]["config_hash"] == run.manifest["config_hash"]
    assert got.config["trained"]["model.widths"] == [16, 12, 8]
    assert "fathom.config" not in json.dumps(sorted(got.config))
    # tags, group and job type
    assert got.run.run_group == "residual lr=0.01" and got.run.job_type == "train"
    assert list(got.run.tags) == ["ciresan", "residual", "complete"]
    # the confusion matrix as one W&B table per row, in the confusion chart's columns
    items = got.history[1][1]
    assert not any(k.startswith("split/val/confusion/") for k in items)
    table = items["split/val/confusion_table"]
    data = json.loads((path.parent / "files" / table["path"]).read_text())
    assert data["columns"] == ["Actual", "Predicted", "nPredictions"]
    m = run.rows[1]["split/val/confusion"]
    assert data["data"] == [[i, j, m[i][j]] for i in range(3) for j in range(3)]
    assert "_wandb" in got.config and "visualize" in got.config["_wandb"]


@pytest.mark.parametrize("damage", ["timestamp", "table", "tags", "config"])
def test_wandb_read_back_catches_each_damage(
    study: Path, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each new piece is read back: writing it wrong fails the verification, naming it."""
    pytest.importorskip("wandb", reason="install the wandb extra")
    from fathom.export import describe, wandb_content, wandb_export

    with monkeypatch.context() as m:
        if damage == "timestamp":
            m.setattr(wandb_export, "wall_time", lambda row, last: (1.0, False))
        elif damage == "table":
            m.setattr(wandb_export, "table_rows", lambda matrix: [[0, 0, -1]])
        elif damage == "tags":
            m.setattr(wandb_export, "run_tags", lambda run: ["other"])
        else:
            real = wandb_content.as_trained
            m.setattr(wandb_content, "as_trained", lambda run: {**real(run), "model.widths": [1]})
        export(study, "wandb")
    report = verify(study, "wandb")
    words = {"timestamp": "_timestamp", "table": "table", "tags": "tags", "config": "config"}
    assert not report.ok and any(words[damage] in x for x in report.mismatches), report.lines()
    assert describe.run_tags  # the real function is back


def test_wandb_tuning_run_has_its_job_type(tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="install the wandb extra")
    from synthetic_runs import synthetic_history

    root = tmp_path / "s"
    write_run(
        root / "tune-1", study="s", recipe="plain", seed=1, lr=0.1,
        rows=synthetic_history(1, (0, 1), layers=3, classes=3), phase="tuning",
    )  # fmt: skip
    assert export(root, "wandb").ok
    got, _ = _wandb_read(root / "exports" / "wandb", "tune-1")
    assert got.run.job_type == "tuning" and "tuning" in got.run.tags
    assert got.run.run_group == "plain lr=0.1 (tuning)"


def test_wandb_checkpoints_as_artifacts(tiny_run_copy: Path, tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="install the wandb extra")
    import base64
    import hashlib

    run = load_runs(tiny_run_copy)[0]
    out = tmp_path / "wb"
    report = export(tiny_run_copy, "wandb", out, checkpoints=True)
    assert report.ok, report.lines()
    got, _ = _wandb_read(out, run.run_id)
    saved = sorted(int(k) for k in run.manifest["checkpoints"])
    assert sorted(json.loads(a.metadata)["epoch"] for a in got.artifacts) == saved == [0, 1, 2, 3]
    final = run.manifest["final"]["epoch"]
    by_epoch = {json.loads(a.metadata)["epoch"]: a for a in got.artifacts}
    assert "final" in by_epoch[final].aliases and f"epoch-{final}" in by_epoch[final].aliases
    assert {a.name for a in got.artifacts} == {f"model-{run.run_id}"}
    entry = run.manifest["checkpoints"][str(final)]
    content = (tiny_run_copy / entry["file"]).read_bytes()
    assert (
        by_epoch[final].manifest.contents[0].digest
        == base64.b64encode(hashlib.md5(content).digest()).decode()
    )
    assert json.loads(by_epoch[final].metadata)["sha256"] == entry["sha256"]
    # a checkpoint changed after the export: the read-back says which
    (tiny_run_copy / entry["file"]).write_bytes(content + b"x")
    again = verify(tiny_run_copy, "wandb", out)
    assert any(f"checkpoint epoch {final}" in m for m in again.mismatches), again.lines()
    # and a damaged checkpoint is never exported
    with pytest.raises(FathomError, match="differs from the SHA-256"):
        export(tiny_run_copy, "wandb", tmp_path / "wb2", checkpoints=True)


def test_checkpoints_option_is_refused_where_it_does_not_apply(study: Path) -> None:
    with pytest.raises(FathomError, match=r"--checkpoints .* is an option of wandb, not of jsonl"):
        export(study, "jsonl", checkpoints=True)


# -- HParams as trained ---------------------------------------------------------------------
def _run(config: dict, manifest: dict | None = None) -> RunData:
    return RunData(Path("/nowhere/r"), "r", {"config": config, **(manifest or {})}, [])


@given(
    widths=st.lists(st.integers(1, 3000), min_size=2, max_size=6),
    mult=st.floats(0.01, 4.0, allow_nan=False),
)
@example(widths=[2500, 2000, 1500, 1000, 500], mult=0.1)
@example(widths=[3, 1], mult=0.1)  # rounds to 0: at least one unit
def test_hparams_state_the_widths_trained(widths: list[int], mult: float) -> None:
    config = {
        "model": {"kind": "ciresan", "widths": widths, "width_mult": mult, "recipe": "plain"},
        "data": {"dataset": "mnist", "data_dir": "/home/me/data", "path": None},
        "telemetry": {"every": 5},
        "checkpoints": {"save_epochs": [0]},
        "optim": {"lr": 0.1, "schedule": {"gamma": None}},
        "device": "auto",
        "name": "r",
    }
    hp = hparams(_run(config, {"environment": {"device": "cpu"}, "model": {"parameters": 7}}))
    expected = [max(1, math.floor(w * mult + 0.5)) if (w * mult) % 1 != 0.5 else None
                for w in widths]  # fmt: skip
    got = json.loads(hp["model.widths"])
    assert all(e is None or g == e for g, e in zip(got, expected)) and len(got) == len(widths)
    assert all(g >= 1 for g in got)
    assert hp["model.width_mult"] == mult and hp["model.parameters"] == 7
    assert hp["device"] == "cpu" and hp["optim.lr"] == 0.1
    assert not [k for k in hp if any(k == p or k.startswith(p + ".") for p in NOT_HYPERPARAMETERS)]
    assert "optim.schedule.gamma" not in hp and "data.path" not in hp  # unset options


def test_hparams_of_the_quick_study_run() -> None:
    """A × 0.1 Ciresan run once listed full widths and data.data_dir as hyperparameters."""
    config = {
        "model": {"kind": "ciresan", "widths": [2500, 2000, 1500, 1000, 500], "width_mult": 0.1},
        "data": {"data_dir": None, "dataset": "mnist"},
        "execution": {"path": "auto", "max_graph_branches": 6, "precision": "tf32"},
    }
    run = _run(config, {"execution": {"path": "eager"}})
    hp = hparams(run)
    assert hp["model.widths"] == "[250, 200, 150, 100, 50]"
    assert hp["execution.path"] == "eager" and hp["execution.precision"] == "tf32"
    assert not any(k.startswith("data.data_dir") or "max_graph" in k for k in hp)
    assert as_trained(_run({"model": {"kind": "python", "factory": "m:f"}})) == {}
    staged = as_trained(_run({"model": {"kind": "staged_conv", "width_mult": 0.25}}))
    assert staged["model.widths"] == [16, 32, 64, 128]
    assert run_tags(_run({"model": {"kind": "ciresan"}, "tags": {"arm": "x" * 100}})) == [
        "ciresan",
        "arm=" + "x" * 60,
    ]


def test_tensorboard_hparams_are_those_described(study: Path) -> None:
    pytest.importorskip("tensorboard", reason="install the tensorboard extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from fathom.export import tensorboard_meta as meta

    assert export(study, "tensorboard").ok
    run = load_runs(study)[0]
    acc = EventAccumulator(str(study / "exports" / "tensorboard" / run.run_id))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")[meta.SESSION_TAG]
    got = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert set(got) == set(hparams(run)) and "name" not in got and "study" not in got
    assert got["model.widths"].string_value == "[16, 12, 8]"
    assert got["device"].string_value == "cpu" and got["execution.path"].string_value == "eager"


# -- analyses in TensorBoard ----------------------------------------------------------------
def _analysed(run_dir: Path) -> None:
    """A real curvature summary (epochs 1, 3) and a real audit (selected and final) of the run."""
    from conftest import synthetic_splits
    from fathom.audit.checkpoint import AuditSettings
    from fathom.audit.run import audit_runs
    from fathom.curvature.rundir import run_curvature
    from fathom.rundir import RunDir

    class Synthetic(RunDir):
        def load_splits(self, device: str = "cpu"):
            return synthetic_splits()

    run_curvature(Synthetic(run_dir), [1, 3], probe=8)
    settings = AuditSettings(
        checkpoints=("selected", "final"), router=False, timing_batch_sizes=(4,), timing_repeats=1
    )
    audit_runs(run_dir, settings, splits=synthetic_splits())


def test_dashboards_export_curvature_and_audit(tiny_run_copy: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="install the tensorboard extra")
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _analysed(tiny_run_copy)
    run = load_runs(tiny_run_copy)[0]
    out = tmp_path / "tb"
    report = export(tiny_run_copy, "tensorboard", out)
    assert report.ok, report.lines()
    acc = EventAccumulator(str(out / run.run_id), size_guidance={"scalars": 0})
    acc.Reload()
    curv = json.loads((tiny_run_copy / "curvature" / "summary.json").read_text())["rows"]
    ggn = acc.Scalars("curvature/ggn_weight_trace")
    assert [e.step for e in ggn] == [1, 3]
    assert [e.value for e in ggn] == [np.float32(r["ggn_weight_trace"]) for r in curv]
    assert acc.Scalars("curvature/probe_acc_pct")[0].value == np.float32(
        100 * curv[0]["probe_accuracy"]
    )
    assert "Gauss-Newton" in acc.SummaryMetadata("curvature/ggn_weight_trace").summary_description
    audit = json.loads((tiny_run_copy / "audit" / "audit.json").read_text())["runs"][0]
    final = audit["checkpoints"]["final"]
    mask = final["masks"][0]
    tag = f"audit/final/mask/{mask['mask']}/test/acc_pct"
    assert [(e.step, e.value) for e in acc.Scalars(tag)] == [
        (final["epoch"], np.float32(100 * mask["test"]["acc"]))
    ]
    branch = final["branches"][0]
    assert acc.Scalars("audit/final/branch/0/val/damage")[0].value == np.float32(
        branch["val"]["damage"]
    )
    assert "deleted" in acc.SummaryMetadata("audit/final/branch/0/val/damage").summary_description
    assert any(t.startswith("audit/selected/kept/") for t in acc.Tags()["scalars"])
    # W&B logs the same scalars with the row of their epoch, float64-exact
    pytest.importorskip("wandb", reason="install the wandb extra")
    assert export(tiny_run_copy, "wandb", tmp_path / "wb").ok
    got, _ = _wandb_read(tmp_path / "wb", run.run_id)
    history = dict(got.history)
    assert [history[r["epoch"]]["curvature/ggn_weight_trace"] for r in curv] == [
        r["ggn_weight_trace"] for r in curv
    ]
    assert history[final["epoch"]][tag] == 100 * mask["test"]["acc"]
    assert "curvature/ggn_weight_trace" not in history[0]
    # a new analysis makes the export stale; one computed from other weights is left out
    summary = tiny_run_copy / "curvature" / "summary.json"
    doc = json.loads(summary.read_text())
    doc["rows"][0]["params_sha256"] = "0" * 64
    summary.write_text(json.dumps(doc))
    stale = verify(tiny_run_copy, "tensorboard", out)
    assert any("analysis hashes" in m for m in stale.mismatches), stale.lines()
    again = export(tiny_run_copy, "tensorboard", out, force=True)
    assert again.ok, again.lines()
    acc = EventAccumulator(str(out / run.run_id), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("curvature/ggn_weight_trace")] == [3]


def test_cli_checkpoints_flag(study: Path, capsys: pytest.CaptureFixture) -> None:
    from fathom.cli import main

    assert main(["export", str(study), "--to", "tensorboard", "--checkpoints"]) == 2
    assert "is an option of wandb, not of tensorboard" in capsys.readouterr().err


_value = st.one_of(
    st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**6), 10**6)
)


@given(
    rows=st.dictionaries(
        st.integers(0, 6),
        st.tuples(
            st.booleans(), st.dictionaries(st.sampled_from(["rho", "probe_accuracy", "x"]), _value)
        ),
        max_size=5,
    )
)
@example(rows={1: (False, {"rho": 1.0})})  # computed from other weights: left out, said
@example(rows={2: (True, {"probe_accuracy": 0.5})})  # a fraction exported in percent
def test_curvature_rows_are_exported_exactly_when_they_describe_the_weights(
    rows: dict[int, tuple[bool, dict]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Property: every numeric column of a row whose params hash is the manifest's appears
    once, at its epoch, in export units (``probe_accuracy`` -> percent); a row from other
    weights is left out and named; nothing else appears."""
    from fathom.export.analyses import run_analyses

    path = tmp_path_factory.mktemp("curv")
    checkpoints = {str(e): {"file": f"e{e}", "params_sha256": f"h{e}"} for e in rows}
    summary = [
        {"epoch": e, "params_sha256": f"h{e}" if same else "other", **cols}
        for e, (same, cols) in sorted(rows.items())
    ]
    (path / "curvature").mkdir()
    (path / "curvature" / "summary.json").write_text(json.dumps({"rows": summary}))
    run = RunData(path, "r", {"checkpoints": checkpoints, "config_hash": "c"}, [])
    got = run_analyses(run)
    want: dict[str, list[tuple[int, float]]] = {}
    for e, (same, cols) in sorted(rows.items()):
        for k, v in sorted(cols.items()):
            if not same or v is None:
                continue
            name = "probe_acc_pct" if k == "probe_accuracy" else k
            want.setdefault(f"curvature/{name}", []).append(
                (e, 100.0 * v if k == "probe_accuracy" else float(v))
            )
    assert set(got.points) == set(want)
    for tag, series in want.items():
        assert [e for e, _ in got.points[tag]] == [e for e, _ in series]
        for (_, a), (_, b) in zip(got.points[tag], series):
            assert (math.isnan(a) and math.isnan(b)) or a == b
    left_out = sorted(e for e, (same, _) in rows.items() if not same)
    assert [n for n in got.notes if "other weights" in n] == [
        f"run r: curvature at epoch {e} was computed from other weights than the checkpoint's; "
        "left out (compute it again: fathom curvature)"
        for e in left_out
    ]
