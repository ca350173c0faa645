"""The recorder's field set follows the model's structure (issue 20): a layer unfrozen or a
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
