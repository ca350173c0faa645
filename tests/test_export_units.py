"""Exports write accuracy in percent under ``<name>_pct`` through ``fathom.units.percent``,
state the unit, and a read-back catches an export that holds the history's fractions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import fathom.export.common as common
from fathom.export import export, verify
from fathom.export.common import ACCURACY_PATTERNS, accuracy_name, in_export_units
from fathom.report.runs import load_runs
from fathom.telemetry.registry import FIELDS, field_for
from fathom.telemetry.trainer_fields import TRAINER_FIELDS
from synthetic_runs import write_study


@pytest.fixture
def study(tmp_path: Path) -> Path:
    root = tmp_path / "study"
    write_study(root, recipes=("residual",), seeds=(101,), epochs=(0, 1, 2), layers=2, classes=3)
    return root


def test_every_declared_accuracy_field_is_converted() -> None:
    """A new accuracy field in the registry cannot slip into the exports as a fraction."""
    declared = {
        f.pattern
        for f in (*FIELDS, *TRAINER_FIELDS)
        if any(seg.endswith("acc") for seg in f.pattern.split("/"))
    }
    assert declared == set(ACCURACY_PATTERNS)
    for pattern in ACCURACY_PATTERNS:
        assert field_for(pattern.replace("{split}", "val").replace("{cls}", "3")).units == (
            "fraction in [0, 1]"
        )


def test_exported_names() -> None:
    assert accuracy_name("val/acc") == "val/acc_pct"
    assert accuracy_name("fit/acc") == "fit/acc_pct"
    assert accuracy_name("train/acc") == "train/acc_pct"
    assert accuracy_name("probe/acc") == "probe/acc_pct"
    assert accuracy_name("split/test/class_acc/7") == "split/test/class_acc_pct/7"
    for other in ("val/ce", "probe/act/zero_frac/head", "split/val/class_count/1", "note", "epoch"):
        assert accuracy_name(other) is None


def test_values_are_percent_of_the_fraction() -> None:
    row = {
        "epoch": 3,
        "val/acc": 0.9863,
        "test/acc": None,
        "fit/acc": math.nan,
        "split/val/class_acc/0": 1,
        "val/ce": 0.0431,
    }
    out = in_export_units(row)
    assert out["val/acc_pct"] == 100.0 * 0.9863  # float64 reference, the same product
    assert out["test/acc_pct"] is None and math.isnan(out["fit/acc_pct"])
    assert out["split/val/class_acc_pct/0"] == 100.0
    assert out["val/ce"] == 0.0431 and out["epoch"] == 3
    assert not {"val/acc", "test/acc", "fit/acc", "split/val/class_acc/0"} & set(out)
    with pytest.raises(Exception, match="reserved for exported accuracies"):
        in_export_units({"val/acc": 0.5, "val/acc_pct": 50.0})


def test_jsonl_values_and_stated_units(study: Path) -> None:
    assert export(study, "jsonl").ok
    lines = [
        json.loads(x) for x in (study / "exports/jsonl/history.jsonl").read_text().splitlines()
    ]
    rows = load_runs(study)[0].rows
    for line, row in zip(lines, rows):
        assert line["val/acc_pct"] == 100.0 * row["val/acc"]
        assert line["split/val/class_acc_pct/2"] == 100.0 * row["split/val/class_acc/2"]
        assert line["val/ce"] == row["val/ce"] and "val/acc" not in line
    record = json.loads((study / "exports/jsonl/fathom-export.json").read_text())
    assert record["units"]["keys"]["val/acc_pct"] == "%"
    assert "percent" in record["units"]["accuracy"]


@pytest.mark.parametrize("target", ["jsonl", "tensorboard", "wandb"])
def test_a_fraction_valued_export_fails_the_read_back(
    study: Path, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    pytest.importorskip({"jsonl": "json", "tensorboard": "tensorboard", "wandb": "wandb"}[target])
    with monkeypatch.context() as m:  # a wrong conversion at write time: fractions under _pct
        m.setattr(common, "percent", lambda f: f)
        export(study, target)
    report = verify(study, target)
    assert not report.ok
    assert any("acc_pct" in x for x in report.mismatches), report.mismatches[:3]
    assert not any("/ce" in x for x in report.mismatches)  # only the accuracies are wrong


def test_tensorboard_states_the_unit(study: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fathom.export import tensorboard_meta

    assert export(study, "tensorboard").ok
    acc = EventAccumulator(str(study / "exports/tensorboard/residual-s101"))
    acc.Reload()
    meta = acc.SummaryMetadata("val/acc_pct")
    assert meta.display_name == "val/acc_pct (%)" and "percent" in meta.summary_description
    assert "percent" not in acc.SummaryMetadata("val/ce").summary_description  # nats, not %
    with m_context(monkeypatch) as m:
        m.setattr(tensorboard_meta, "PERCENT_NOTE", "accuracy as recorded")
        export(study, "tensorboard", force=True)
    report = verify(study, "tensorboard")
    assert any("val/acc_pct: the registry description" in x for x in report.mismatches)


def m_context(monkeypatch: pytest.MonkeyPatch):
    return monkeypatch.context()


def test_wandb_config_states_the_unit(study: Path) -> None:
    pytest.importorskip("wandb")
    from fathom.export.wandb_export import run_config

    assert export(study, "wandb").ok
    units = run_config(load_runs(study)[0])["fathom"]["units"]
    assert units["val/acc_pct"] == "%" and units["split/fit/class_acc_pct/0"] == "%"


def test_an_export_of_the_old_format_is_named(study: Path) -> None:
    assert export(study, "jsonl").ok
    path = study / "exports/jsonl/fathom-export.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "format": 1}))
    report = verify(study, "jsonl")
    assert any("export format 1" in m and "export again" in m for m in report.mismatches)
