"""Telemetry is read-only: state untouched by one observation, and a run ends byte-identical."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from fathom.depth import GateController
from fathom.io import state_dict_digest
from fathom.models.ciresan import recipe_schedule
from test_telemetry import CASES, CLASSES, build, context, make_splits, recorder

torch.set_num_threads(1)


def _snapshot(model, opt):
    return {
        "params": state_dict_digest(model.state_dict()),
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "opt": copy.deepcopy(opt.state_dict()),
        "flags": [m.training for m in model.modules()],
        "gains": [b.gain for b in model.branches()],
        "rng": torch.get_rng_state(),
        "requires_grad": [p.requires_grad for p in model.parameters()],
    }


def _same(a, b) -> list[str]:
    bad = [k for k in ("params", "flags", "gains", "requires_grad") if a[k] != b[k]]
    if not torch.equal(a["rng"], b["rng"]):
        bad.append("rng")
    for i, (x, y) in enumerate(zip(a["grads"], b["grads"], strict=True)):
        if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
            bad.append(f"grad {i}")
    if repr(a["opt"]) != repr(b["opt"]):
        bad.append("optimizer state")
    return bad


def test_one_observation_leaves_every_piece_of_state_as_found():
    model = build(CASES[4], torch.float32)
    splits = make_splits(seed=21)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    F.cross_entropy(model(splits.fit_x), splits.fit_y).backward()
    opt.step()
    # Mixed state an instrument must not disturb: stale grads on some params, None on others,
    # training mode with one submodule in eval, SD gains mid-schedule.
    F.cross_entropy(model(splits.fit_x[:5]), splits.fit_y[:5]).backward()
    model.head.weight.grad = None
    model.train()
    model.blocks[0].eval()
    before = _snapshot(model, opt)
    row = recorder(model, splits, probe=12).observe(context(model, splits, opt))
    assert row["grad/pex/diversity/stem"] is not None
    assert _same(before, _snapshot(model, opt)) == []


def _tiny_run(case, telemetry: bool, epochs: int = 3) -> tuple[str, list[dict]]:
    """A small SGD loop with dropout / SD gate sampling; telemetry between epochs if asked."""
    model = build(case, torch.float32)
    for b in model.branches():
        b.gain = 1.0
    splits = make_splits(n_fit=40, n_val=8, seed=31)
    torch.manual_seed(1234)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    controller = None
    if model.recipe.schedule_kind != "none":
        controller = GateController(model.branches(), recipe_schedule(model.recipe, epochs), seed=5)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rec = recorder(model, splits, probe=10, epochs=epochs) if telemetry else None
    shuffle = torch.Generator().manual_seed(7)
    rows = []
    for epoch in range(epochs + 1):
        if rec is not None and rec.due(epoch):
            rows.append(rec.observe(context(model, splits, opt, init)))
        if epoch == epochs:
            break
        model.train()
        perm = torch.randperm(40, generator=shuffle)
        for start in range(0, 40, 8):
            idx = perm[start : start + 8]
            if controller is not None:
                controller.sample(epoch)
            F.cross_entropy(model(splits.fit_x[idx]), splits.fit_y[idx]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if controller is not None:
            controller.release()
    return state_dict_digest(model.state_dict()) + repr(opt.state_dict()["state"].keys()), rows


def test_short_run_is_byte_identical_with_telemetry_on_and_off():
    for case in (CASES[2], CASES[3]):  # unit dropout (global RNG) and SD (gate sampling)
        off, _ = _tiny_run(case, telemetry=False)
        on, rows = _tiny_run(case, telemetry=True)
        assert off == on, case["id"]
        assert len(rows) == 3 and rows[-1]["param/update_ratio/stem"] is not None


def _trainer_setup(tmp_path):
    from fathom.config import validate_run_config
    from fathom.data import DataSplits

    cfg = validate_run_config(
        {
            "name": "tiny",
            "device": "cpu",
            "model": {"recipe": "sd_constant", "widths": [16, 12, 12, 8, 8]},
            "optim": {"epochs": 3, "batch_size": 16, "lr": 0.05},
            "eval": {"every": 2, "first": [1], "batch_size": 64},
            "checkpoints": {"save_epochs": [0]},
            "telemetry": {"enabled": False, "probe_size": 12, "every": 2},
        }
    )
    parts = make_splits(n_fit=48, n_val=16, n_test=16, seed=41)
    # the data's own class count: without it, MNIST's 10 was once taken silently (now refused)
    splits = DataSplits(
        *(parts.fit_x, parts.fit_y, parts.val_x, parts.val_y, parts.test_x, parts.test_y),
        "test-hash",
        info={"classes": CLASSES},
    )
    return cfg, splits


def test_trainer_run_with_telemetry_ends_byte_identical(tmp_path):
    from fathom.train.qualify import qualify

    cfg, splits = _trainer_setup(tmp_path)
    q = qualify(cfg, tmp_path / "q", splits=splits, gate=1e9)
    assert q.params_identical and q.final_params_on is not None
    assert q.history_mismatches == []
    assert q.passed and q.telemetry_cold_s is not None and q.overhead is not None
    assert (tmp_path / "q" / "qualification.json").exists()
    from fathom.io import read_jsonl

    rows, _ = read_jsonl(tmp_path / "q" / "on" / "history.jsonl")
    by_epoch = {r["epoch"]: r for r in rows}
    assert sorted(by_epoch) == [0, 1, 2, 3]
    assert by_epoch[2]["grad/pex/diversity/head"] is not None
    assert by_epoch[3]["split/test/confusion"] is not None


def test_qualify_reports_a_failed_gate(tmp_path):
    from fathom.train.qualify import qualify

    cfg, splits = _trainer_setup(tmp_path)
    q = qualify(cfg, tmp_path / "q", splits=splits, gate=1e-9)
    assert q.params_identical and not q.passed


def test_history_mismatch_is_reported():
    from fathom.train.qualify import history_mismatches

    off = [{"epoch": 0, "val/acc": 0.5, "clock/training_s": 1.0}]
    on = [{"epoch": 0, "val/acc": 0.25, "clock/training_s": 2.0, "probe/ce": 1.0}]
    assert history_mismatches(off, on) == ["epoch 0 val/acc: off 0.5, on 0.25"]
    assert history_mismatches(off, [{"epoch": 1}]) == [
        "epoch 0: missing from the telemetry-on history"
    ]


def test_manifest_lists_each_instrumented_layer(tmp_path):
    import json

    from fathom.train.loop import train

    cfg, splits = _trainer_setup(tmp_path)
    cfg = cfg.model_copy(update={"telemetry": cfg.telemetry.model_copy(update={"enabled": True})})
    train(cfg, tmp_path / "run", splits=splits)
    layers = json.loads((tmp_path / "run" / "manifest.json").read_text())["telemetry"]["layers"]
    assert [la["name"] for la in layers] == [
        "stem",
        *(f"blocks.{j}.res.branch" for j in range(4)),
        "head",
    ]
    assert layers[0]["type"] == "Linear" and layers[0]["kind"] == "linear"
    assert layers[1]["params"] == {
        "blocks.0.res.branch.weight": [12, 16],
        "blocks.0.res.branch.bias": [12],
    }


def test_trainer_fields_are_compared_and_telemetry_fields_are_not():
    from fathom.train.qualify import is_scientific

    for name in ("val/acc", "train/loss_running", "optim/lr", "lyap/maximal", "grad_norm/ce"):
        assert is_scientific(name), name
    for name in ("probe/ce", "param/disp_total", "clock/elapsed_s"):
        assert not is_scientific(name), name
