"""The recorder's field set follows the model's structure: a layer unfrozen or a
head swapped between epochs through the library API gives the new fields, with a schema
record, never the old set silently."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from test_telemetry import CASES, build, context, make_splits, recorder

torch.set_num_threads(1)


def _grad_reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor, name: str) -> float:
    """``||(1/N) sum_i dCE_i/dW||`` of parameter ``name`` by plain autograd (dense eval)."""
    was = model.training
    model.eval()
    p = dict(model.named_parameters())[name]
    with torch.enable_grad():
        g = torch.autograd.grad(F.cross_entropy(model(x), y), p)[0]
    model.train(was)
    return float(g.norm())


def test_unfreezing_a_layer_between_epochs_gives_its_fields_and_a_schema_record():
    splits = make_splits()
    model = build(CASES[0])
    model.stem.requires_grad_(False)  # a frozen backbone layer
    rec = recorder(model, splits, probe=16, families=("gradients",))
    ctx = context(model, splits)
    first = rec.observe(ctx)
    assert not any(k.endswith("/stem") for k in first)
    assert rec.schema_changes == []

    model.stem.requires_grad_(True)  # the fine-tuning pattern, between epochs
    ctx.epoch = 1
    row = rec.observe(ctx)
    assert set(row) == set(rec.field_names())
    added = sorted(k for k in row if k not in first)
    assert added and all(k.endswith("/stem") for k in added)
    x, y = rec.probe_x, rec.probe_y
    want = _grad_reference(model, x, y, "stem.weight")
    got = row["grad/mean/weight_norm/stem"]
    assert abs(got - want) <= 1e-9 * want, (got, want)
    (change,) = rec.schema_changes
    assert change["epoch"] == 1 and sorted(change["added"]) == added
    assert change["removed"] == [] and "stem" in change["layers"]

    model.stem.requires_grad_(False)  # frozen again: its fields leave the row, recorded
    ctx.epoch = 2
    again = rec.observe(ctx)
    assert set(again) == set(first)
    assert rec.schema_changes[-1]["epoch"] == 2
    assert sorted(rec.schema_changes[-1]["removed"]) == added

    restored = recorder(model, splits, probe=16, families=("gradients",))
    restored.load_state_dict(rec.state_dict())  # a resume keeps the record
    assert restored.schema_changes == rec.schema_changes


def test_a_swapped_head_is_measured_not_the_old_one():
    splits = make_splits()
    model = build(CASES[0])
    rec = recorder(model, splits, probe=16, families=("params",))
    ctx = context(model, splits)
    old = rec.observe(ctx)["param/weight_norm/head"]
    assert abs(old - float(model.head.weight.detach().norm())) <= 1e-12 * old
    g = torch.Generator().manual_seed(9)
    new = nn.Linear(model.head.in_features, model.head.out_features).double()
    with torch.no_grad():
        new.weight.copy_(torch.randn(new.weight.shape, generator=g, dtype=torch.float64))
    model.head = new
    ctx.epoch = 1
    row = rec.observe(ctx)
    assert set(row) == set(rec.field_names())
    assert row["param/weight_norm/head"] == float(new.weight.detach().norm()) != old


def test_a_structure_change_mid_run_is_recorded_in_the_manifest(tmp_path, monkeypatch):
    """The trainer writes the recorder's schema changes into the manifest's telemetry
    section: the stem frozen after epoch 0 (through the library API) gives one record whose
    removed fields include the stem's, at the first epoch observed without them. (The stem trains
    in every epoch, the stepper differentiates every parameter; it is frozen from the end of
    epoch 1's steps on, so every observation from epoch 1 sees it frozen.)"""
    import json

    import fathom.train.loop as loop
    from test_telemetry_readonly import _trainer_setup

    real = loop.train_epoch

    def freeze_after_first(s, epoch):
        s.model.stem.requires_grad_(True)
        fields = real(s, epoch)
        s.model.stem.requires_grad_(epoch < 1)
        return fields

    monkeypatch.setattr(loop, "train_epoch", freeze_after_first)
    cfg, splits = _trainer_setup(tmp_path)
    tel = cfg.telemetry.model_copy(update={"enabled": True, "every": 1})
    loop.train(cfg.model_copy(update={"telemetry": tel}), tmp_path / "run", splits=splits)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    (change,) = manifest["telemetry"]["schema_changes"]
    assert change["epoch"] == 1 and change["added"] == []
    assert any(k.endswith("/stem") for k in change["removed"])
    assert "stem" not in change["layers"] and "head" in change["layers"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").open()]
    assert any(k in rows[0] for k in change["removed"])
    assert not any(k in row for row in rows[1:] for k in change["removed"])


def test_a_run_without_a_change_records_none_and_without_telemetry_null(tmp_path):
    import json

    from fathom.train.loop import train
    from test_telemetry_readonly import _trainer_setup

    cfg, splits = _trainer_setup(tmp_path)
    train(cfg, tmp_path / "off", splits=splits)
    off = json.loads((tmp_path / "off" / "manifest.json").read_text())["telemetry"]
    assert off["schema_changes"] is None
    tel = cfg.telemetry.model_copy(update={"enabled": True})
    train(cfg.model_copy(update={"telemetry": tel}), tmp_path / "on", splits=splits)
    on = json.loads((tmp_path / "on" / "manifest.json").read_text())["telemetry"]
    assert on["schema_changes"] == []
