"""The ``[loss]`` table of a run: config, training, split losses, audit damage and curvature.

Every value is checked against a float64 recomputation written here from the formulas
(one-hot targets ``t = e_y``; ``mse = (1/(N C)) sum (z - t)^2``; BCE ``softplus(z) - t z``;
smoothed CE ``-sum_c t'_c log p_c``), never against the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.base.io import config_digest
from fathom.cli import main
from fathom.config import RunConfig, parse_toml
from fathom.config.run import LossConfig, loss_with, validate_run_config
from fathom.errors import FathomError
from fathom.losses import LOSSES, make_loss
from fathom.losses.labels import LabelLoss
from fathom.rundir import RunDir

torch.set_num_threads(1)
CLASSES, FEATURES = 3, 12


# -- float64 references, written from the formulas -------------------------------------------
def one_hot64(y: torch.Tensor, c: int = CLASSES) -> torch.Tensor:
    t = torch.zeros(y.shape[0], c, dtype=torch.float64)
    t[torch.arange(y.shape[0]), y] = 1.0
    return t


def reference(name: str, z: torch.Tensor, y: torch.Tensor, reduction="mean", eps=0.0) -> float:
    """The loss ``name`` of logits ``z`` ``[N, C]`` against labels ``y``, float64, by hand."""
    z = z.to(torch.float64)
    c = z.shape[1]
    if name == "cross_entropy":
        log_p = z - torch.logsumexp(z, 1, keepdim=True)
        t = (1 - eps) * one_hot64(y, c) + eps / c
        per = -(t * log_p).sum(1)
        return float(per.mean() if reduction == "mean" else per.sum())
    t = one_hot64(y, c)
    if name == "mse":
        entries = (z - t) ** 2
    else:
        entries = torch.log1p(torch.exp(-z.abs())) + z.clamp_min(0) - t * z
    return float(entries.mean() if reduction == "mean" else entries.sum())


# -- a run on user tensors (re-derivable by every analysis) -----------------------------------
def data_file(tmp_path: Path, n: int = 240) -> Path:
    rng = np.random.default_rng(0)
    y = rng.integers(0, CLASSES, n)
    x = (rng.standard_normal((n, FEATURES)) + y[:, None]).astype(np.float32)
    np.savez(tmp_path / "blobs.npz", x=x, y=y)
    return tmp_path / "blobs.npz"


def run_config(npz: Path, loss: dict | None = None, **extra) -> RunConfig:
    data = {
        "name": "l",
        "study": "loss",
        "seed": 5,
        "device": "cpu",
        "data": {"dataset": "tensors", "path": str(npz)},
        "model": {"widths": [16, 12, 10, 8, 6], "recipe": "sd_constant"},
        "optim": {"lr": 0.05, "batch_size": 16, "epochs": 2},
        "eval": {"every": 1},
        "checkpoints": {"save_epochs": [0, 1, 2]},
        **extra,
    }
    if loss is not None:
        data["loss"] = loss
    return validate_run_config(data)


def train_run(cfg: RunConfig, where: Path) -> RunDir:
    from fathom.train.loop import train

    res = train(cfg, where)
    assert res.status == "complete", res.status
    return RunDir(where)


def history(rd: RunDir) -> list[dict]:
    return [json.loads(line) for line in (rd.path / "history.jsonl").read_text().splitlines()]


# -- the config ------------------------------------------------------------------------------
def test_loss_names_are_the_losses_registry():
    from typing import get_args

    from fathom.config.run import LossName

    assert list(get_args(LossName)) == list(LOSSES)


def test_absent_or_default_table_keeps_the_config_hash():
    base = RunConfig()
    said = RunConfig.model_validate({"loss": {"name": "cross_entropy", "reduction": "mean"}})
    assert said.model_dump() == base.model_dump() and "loss" not in base.model_dump()
    assert config_digest(said.model_dump()) == config_digest(base.model_dump())
    other = base.with_updates({"loss.name": "mse", "loss.target": "one_hot"})
    assert other.model_dump()["loss"]["name"] == "mse"
    assert config_digest(other.model_dump()) != config_digest(base.model_dump())
    assert other.with_updates({"optim.lr": 0.02}).loss == other.loss  # kept by with_updates


def test_toml_table_reads():
    text = '[loss]\nname = "cross_entropy"\nlabel_smoothing = 0.1\nreduction = "sum"\n'
    cfg = validate_run_config(parse_toml(text, "test"))
    assert cfg.loss == LossConfig(label_smoothing=0.1, reduction="sum")


@pytest.mark.parametrize(
    ("table", "texts"),
    [
        ({"name": "mes"}, ("loss.name", "did you mean 'mse'")),
        ({"name": "cross_entropie"}, ("did you mean 'cross_entropy'",)),
        ({"name": "mse"}, ("loss.target = 'one_hot'",)),
        ({"name": "bce_with_logits"}, ("loss.target = 'one_hot'",)),
        ({"name": "mse", "target": "one_hot", "label_smoothing": 0.1}, ("remove it",)),
        ({"name": "bce_with_logits", "target": "one_hot", "ignore_index": 0}, ("remove it",)),
        ({"target": "one_hot"}, ("remove loss.target",)),
        ({"reduction": "avg"}, ("loss.reduction",)),
        ({"label_smoothing": 1.5}, ("loss.label_smoothing",)),
        ({"nme": "mse"}, ("unknown key 'loss.nme'",)),
    ],
)
def test_bad_tables_are_refused_naming_the_fix(table, texts):
    with pytest.raises(FathomError) as e:
        validate_run_config({"loss": table})
    for text in texts:
        assert text in str(e.value), str(e.value)


def test_combinations_that_do_not_fit_are_refused():
    mse = {"name": "mse", "target": "one_hot"}
    with pytest.raises(FathomError, match="token cross-entropy; remove the"):
        validate_run_config(
            {
                "model": {"kind": "gpt"},
                "data": {"dataset": "text", "path": "t.txt", "context": 8},
                "loss": {"label_smoothing": 0.1},
            }
        )
    with pytest.raises(FathomError, match="CE \\+ penalty"):
        validate_run_config(
            {"model": {"kind": "staged_conv"}, "regularizer": {"weight": 0.1}, "loss": mse}
        )
    with pytest.raises(FathomError, match="telemetry.enabled = false"):
        validate_run_config({"telemetry": {"enabled": True}, "loss": mse})
    ok = validate_run_config({"telemetry": {"enabled": True}, "loss": {"label_smoothing": 0.1}})
    assert ok.loss.label_smoothing == 0.1


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(list(LOSSES)),
    reduction=st.sampled_from(["mean", "sum"]),
    eps=st.sampled_from([0.0, 0.1]),
    ignore=st.sampled_from([-100, 0]),
)
def test_a_loss_table_dumps_its_own_options_and_reads_back(name, reduction, eps, ignore):
    """Cross-entropy's table dumps every field (its config hash as before the dump rule);
    another loss's dump holds no cross-entropy option; every dump reads back to the table."""
    if name == "cross_entropy":
        table = LossConfig(reduction=reduction, label_smoothing=eps, ignore_index=ignore)
        assert table.model_dump() == {
            "name": name, "reduction": reduction, "label_smoothing": eps,
            "ignore_index": ignore, "target": "labels",
        }  # fmt: skip
    else:
        table = LossConfig(name=name, reduction=reduction, target="one_hot")
        assert table.model_dump() == {"name": name, "reduction": reduction, "target": "one_hot"}
    assert LossConfig.model_validate(table.model_dump()) == table
    cfg = RunConfig().with_updates({"loss": table.model_dump()})
    assert validate_run_config(cfg.model_dump()).loss == table
    assert config_digest(cfg.model_dump()) == config_digest(
        validate_run_config(cfg.model_dump()).model_dump()
    )


def test_a_changed_cross_entropy_option_of_another_loss_is_still_refused():
    mse = RunConfig().with_updates({"loss": {"name": "mse", "target": "one_hot"}})
    with pytest.raises(FathomError, match="loss.label_smoothing is an option of cross_entropy"):
        mse.with_updates({"loss.label_smoothing": 0.1})


def test_loss_with_starts_a_new_name_from_its_defaults():
    smoothed = LossConfig(label_smoothing=0.2, reduction="sum")
    assert loss_with(smoothed, "flags", ignore_index=3) == LossConfig(
        label_smoothing=0.2, reduction="sum", ignore_index=3
    )
    assert loss_with(smoothed, "flags", name="mse", target="one_hot") == LossConfig(
        name="mse", target="one_hot"
    )
    with pytest.raises(FathomError, match="the flags"):
        loss_with(smoothed, "the flags", name="mse")


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(["cross_entropy", "mse", "bce_with_logits"]),
    reduction=st.sampled_from(["mean", "sum"]),
    eps=st.sampled_from([0.0, 0.3]),
    n=st.integers(1, 7),
    c=st.integers(2, 5),
    scale=st.sampled_from([0.1, 3.0, 30.0]),
    seed=st.integers(0, 2**16),
)
# found: the BCE closed form through F.softplus, which returns z above 20 (off by ~1e-11 here)
@example(name="bce_with_logits", reduction="mean", eps=0.0, n=1, c=2, scale=30.0, seed=3)
def test_every_reading_of_a_label_loss_is_the_formula(name, reduction, eps, n, c, scale, seed):
    """The step's value (float64 logits), the split totals and ``c sum_i L_i`` all equal the
    loss written out by hand, for every loss, reduction and smoothing."""
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    options = {"label_smoothing": eps} if name == "cross_entropy" else {}
    target = "labels" if name == "cross_entropy" else "one_hot"
    loss = LabelLoss(make_loss(name, reduction=reduction, **options), target)
    want = reference(name, z, y, reduction, eps if name == "cross_entropy" else 0.0)
    assert float(loss.torch_value(z, y)) == pytest.approx(want, rel=1e-12, abs=1e-12)
    total, count = loss.split_sums(z, y)
    assert count == (n if name == "cross_entropy" else n * c)
    assert loss.reduce(float(total), count) == pytest.approx(want, rel=1e-12, abs=1e-12)
    per, scale_c = loss.example_losses(z, y)
    assert per.shape == (n,)
    assert float(per.sum()) * float(scale_c) == pytest.approx(want, rel=1e-12, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(["cross_entropy", "mse", "bce_with_logits"]),
    reduction=st.sampled_from(["mean", "sum"]),
    eps=st.sampled_from([0.0, 0.1, 0.3]),
    ignore=st.sampled_from([-100, -1, 0]),
)
def test_a_label_loss_reads_back_from_its_json_record(name, reduction, eps, ignore):
    """``LabelLoss.from_record`` inverts ``record`` through JSON (the audit's scores file)."""
    ce = {"label_smoothing": eps, "ignore_index": ignore} if name == "cross_entropy" else {}
    target = "labels" if name == "cross_entropy" else "one_hot"
    loss = LabelLoss(make_loss(name, reduction=reduction, **ce), target)
    back = LabelLoss.from_record(json.loads(json.dumps(loss.record(), sort_keys=True)))
    assert back == loss and back.record() == loss.record()


def test_library_label_loss_refuses_an_unstated_encoding():
    with pytest.raises(FathomError, match="target='one_hot'"):
        LabelLoss(make_loss("mse"))
    with pytest.raises(FathomError, match="target='labels'"):
        LabelLoss(make_loss("cross_entropy"), "one_hot")
    with pytest.raises(FathomError, match="labels range over"):
        LabelLoss(make_loss("mse"), "one_hot").targets(torch.tensor([0, 3]), 3, torch.float64)


# -- training -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("table", "name", "reduction", "eps"),
    [
        ({"name": "mse", "target": "one_hot"}, "mse", "mean", 0.0),
        ({"name": "bce_with_logits", "target": "one_hot", "reduction": "sum"}, "bce", "sum", 0.0),
        ({"label_smoothing": 0.2}, "cross_entropy", "mean", 0.2),
    ],
    ids=["mse", "bce-sum", "ce-smoothed"],
)
def test_training_step_and_split_losses_are_the_configured_loss(
    tmp_path, table, name, reduction, eps
):
    cfg = run_config(data_file(tmp_path), table)
    # the step's loss: torch's function in float32 against the float64 formula
    step = __import__("fathom.train.step", fromlist=["loss_for"]).loss_for(cfg)
    g = torch.Generator().manual_seed(1)
    z, y = torch.randn(16, CLASSES, generator=g), torch.randint(0, CLASSES, (16,), generator=g)
    got = float(step(z, y))
    want = reference(name, z, y, reduction, eps)
    assert got == pytest.approx(want, rel=2e-6, abs=1e-6)
    # the history's {split}/loss: the whole split, recomputed from the saved checkpoint
    rd = train_run(cfg, tmp_path / "run")
    rows = history(rd)
    assert all(r["train/loss_running"] is None or r["train/loss_running"] > 0 for r in rows)
    last = rows[-1]
    splits = rd.load_splits()
    model = rd.load_model(2, dtype=torch.float64)
    model.eval()
    for split in ("fit", "val", "test"):
        x, yy = getattr(splits, f"{split}_x"), getattr(splits, f"{split}_y")
        with torch.no_grad():
            logits = model(x.to(torch.float64))
        assert last[f"{split}/loss"] == pytest.approx(
            reference(name, logits, yy, reduction, eps), rel=1e-5
        )
        assert last[f"{split}/ce"] == pytest.approx(
            reference("cross_entropy", logits, yy), rel=1e-5
        )
    assert rd.config.loss == cfg.loss  # the manifest's config says the loss


def test_default_training_is_the_pre_table_cross_entropy_step(tmp_path, monkeypatch):
    """A run without ``[loss]``, one with the default table written out, and one trained by
    the step as it was before the table existed (``F.cross_entropy`` itself) end with the same
    config hash and bit-identical parameters, and record no ``{split}/loss``."""
    npz = data_file(tmp_path)
    plain = train_run(run_config(npz), tmp_path / "plain")
    said = train_run(run_config(npz, {"name": "cross_entropy"}), tmp_path / "said")
    import fathom.train.steppers as steppers

    monkeypatch.setattr(steppers, "loss_for", lambda cfg: F.cross_entropy)
    before = train_run(run_config(npz), tmp_path / "before")
    hashes = {rd.manifest["hashes"]["final_params"] for rd in (plain, said, before)}
    assert len(hashes) == 1
    assert len({rd.manifest["config_hash"] for rd in (plain, said, before)}) == 1
    assert not any("fit/loss" in row for row in history(plain))
    # the selection is the pre-table one: the first epoch >= 1 of minimum val/ce, the same
    # selected weights, and a manifest ``selected`` of {epoch, val_ce} only
    rows = [r for r in history(plain) if r["epoch"] >= 1 and r.get("val/ce") is not None]
    first_min = min(rows, key=lambda r: (r["val/ce"], r["epoch"]))
    for rd in (plain, said, before):
        assert rd.manifest["selected"] == {
            "epoch": first_min["epoch"],
            "val_ce": first_min["val/ce"],
        }
    sel = {rd.manifest["selected_checkpoint"]["params_sha256"] for rd in (plain, said, before)}
    assert len(sel) == 1


# -- selection by the configured loss ---------------------------------------------------------
def test_objective_field_is_the_split_loss_the_run_records():
    from fathom.config.run import objective_field
    from fathom.train.session import Session

    for table, field in (
        (None, "val/ce"),
        ({"name": "cross_entropy", "reduction": "mean"}, "val/ce"),
        ({"label_smoothing": 0.1}, "val/loss"),
        ({"reduction": "sum"}, "val/loss"),
        ({"name": "mse", "target": "one_hot"}, "val/loss"),
    ):
        cfg = run_config(Path("x.npz"), table)
        assert objective_field(cfg) == field
        # "val/loss" exactly where the trainer records {split}/loss (its loss is not None)
        fake = type("S", (), {"cfg": cfg, "tokens": False})()
        assert (Session.loss.fget(fake) is not None) == (field == "val/loss")


class _SelectingSession:
    """What :func:`fathom.train.observe.select` reads of a session: its config, its progress
    and the weights it saves (recorded here)."""

    def __init__(self, cfg):
        from fathom.train.state import Progress

        self.cfg, self.progress, self.saved = cfg, Progress(), []

    def save_weights(self, which, epoch):
        self.saved.append(epoch)
        return {"epoch": epoch}


@pytest.mark.parametrize(
    ("table", "want"),
    [(None, 3), ({"name": "mse", "target": "one_hot"}, 1)],
    ids=["default-by-ce", "mse-by-loss"],
)
def test_select_keeps_the_minimum_of_the_objective(table, want):
    """Rows whose CE falls while the configured loss rises: the default selects the CE's
    minimum, a [loss] table its loss's; non-finite and epoch-0 values never select."""
    from fathom.train.observe import select

    s = _SelectingSession(run_config(Path("x.npz"), table))
    rows = [
        {"epoch": 0, "val/ce": 0.1, "val/loss": 0.01},
        {"epoch": 1, "val/ce": 2.0, "val/loss": 0.2},
        {"epoch": 2, "val/ce": 1.5, "val/loss": float("nan")},
        {"epoch": 3, "val/ce": 1.0, "val/loss": 0.4},
        {"epoch": 4, "val/ce": 1.0, "val/loss": 0.2},  # ties keep the earlier epoch
    ]
    for r in rows:
        select(s, r["epoch"], r)
    assert s.progress.best["epoch"] == want and s.saved[-1] == want
    got = next(r for r in rows if r["epoch"] == want)
    assert s.progress.best["val_ce"] == got["val/ce"]
    if table is None:
        assert set(s.progress.best) == {"epoch", "val_ce"}
    else:
        assert s.progress.best["val_loss"] == got["val/loss"]


_VALUE = st.one_of(
    st.none(), st.sampled_from([float("nan"), float("inf")]), st.floats(0, 3, width=16)
)


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.tuples(_VALUE, _VALUE), min_size=1, max_size=8),
    by_loss=st.booleans(),
)
def test_select_is_the_first_minimum_of_the_objective(values, by_loss):
    """Over any sequence of boundaries: the selection is the first epoch >= 1 of minimum
    finite objective (``val/loss`` with a [loss] table, ``val/ce`` without), whatever the
    other field does; none when no value is finite."""
    from fathom.train.observe import select

    s = _SelectingSession(run_config(Path("x.npz"), {"reduction": "sum"} if by_loss else None))
    rows = [{"epoch": e, "val/ce": ce, "val/loss": lo} for e, (ce, lo) in enumerate(values)]
    for r in rows:
        select(s, r["epoch"], r)
    field = "val/loss" if by_loss else "val/ce"
    ok = [r for r in rows if r["epoch"] >= 1 and r[field] is not None and np.isfinite(r[field])]
    want = min(ok, key=lambda r: (r[field], r["epoch"]))["epoch"] if ok else None
    assert s.progress.best["epoch"] == want
    assert (s.saved[-1] if s.saved else None) == want


def test_a_loss_run_selects_and_records_by_its_loss(tmp_path):
    rd = train_run(
        run_config(
            data_file(tmp_path),
            {"name": "mse", "target": "one_hot"},
            optim={"lr": 0.05, "batch_size": 16, "epochs": 4},
        ),
        tmp_path / "r",
    )
    rows = [r for r in history(rd) if r["epoch"] >= 1 and r.get("val/loss") is not None]
    first_min = min(rows, key=lambda r: (r["val/loss"], r["epoch"]))
    sel = rd.manifest["selected"]
    assert sel == {
        "epoch": first_min["epoch"],
        "val_ce": first_min["val/ce"],
        "val_loss": first_min["val/loss"],
    }
    assert rd.record.selected.val_loss == first_min["val/loss"]
    assert rd.manifest["selected_checkpoint"]["epoch"] == first_min["epoch"]


def test_tuning_ranks_a_loss_grid_by_its_loss():
    from fathom.study.selection import GridPoint, select_lr

    def point(lr, ce, loss, objective):
        return GridPoint("r", lr, f"r{lr}", "complete", ce, 1, None, None, loss, objective)

    by_loss = [point(0.1, 0.5, 0.9, "val/loss"), point(0.2, 0.9, 0.3, "val/loss")]
    assert select_lr(by_loss) == {"r": 0.2}
    by_ce = [point(0.1, 0.5, None, "val/ce"), point(0.2, 0.9, None, "val/ce")]
    assert select_lr(by_ce) == {"r": 0.1}
    # a default grid point reads as before the loss existed; a loss one says its objective
    assert set(by_ce[0].to_dict()) == {
        "recipe", "lr", "run_id", "status", "val_ce", "selected_epoch", "diverged_epoch",
        "status_reason",
    }  # fmt: skip
    assert by_loss[0].to_dict()["objective"] == "val/loss"
    from fathom.stats.summary_tables import tuning_table

    table = tuning_table(
        {"enabled": True, "grid": [p.to_dict() for p in by_loss], "selected_lr": {"r": 0.2}}
    )
    assert "Min validation loss" in table.columns and table.rows[1][3].value == 0.3


# -- the audit's damage -----------------------------------------------------------------------
def brute_damage(model, x, y, masks, name: str) -> np.ndarray:
    """``L_m - L_full`` by running the model under every mask, float64 by hand."""
    from fathom.depth import branch_mask, dense_eval

    values = []
    with dense_eval(model), torch.no_grad():
        for row in masks:
            with branch_mask(model, tuple(int(b) for b in row)):
                values.append(reference(name, model(x).float(), y))
    values = np.array(values)
    return values - values[int(np.flatnonzero(masks.all(axis=1))[0])]


def tiny_residual_model():
    from fathom.config import ModelConfig
    from fathom.models import build_model

    torch.manual_seed(0)
    return build_model(
        ModelConfig(recipe="sd_constant", widths=(16, 12, 10, 8, 6)), CLASSES, FEATURES
    )


@pytest.mark.parametrize("name", ["mse", "bce_with_logits"])
def test_library_audit_damage_under_a_loss_is_brute_force(tmp_path, name):
    from fathom.audit import evaluate_masks
    from fathom.audit.evaluate import load_scores, save_scores

    model = tiny_residual_model()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(40, FEATURES, generator=g), torch.randint(0, CLASSES, (40,), generator=g)
    scores = evaluate_masks(model, x, y, loss=name, target="one_hot")
    np.testing.assert_allclose(
        np.asarray(scores.damage()), brute_damage(model, x, y, scores.masks, name), atol=1e-6
    )
    assert scores.damage().quantity == "loss damage"
    ce = evaluate_masks(model, x, y)
    np.testing.assert_array_equal(ce.mean_ce(), scores.mean_ce())  # CE and accuracy as before
    save_scores(str(tmp_path / "s.npz"), {"val": scores}, {"run_id": "r"})
    back, meta = load_scores(str(tmp_path / "s.npz"))
    np.testing.assert_array_equal(back["val"].damage(), scores.damage())
    assert meta == {"run_id": "r"} and back["val"].loss == scores.loss
    with pytest.raises(FathomError, match="target='one_hot'"):
        evaluate_masks(model, x, y, loss=name)


def test_library_audit_default_is_bit_identical_to_plain_ce():
    from fathom.audit import evaluate_masks

    model = tiny_residual_model()
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(30, FEATURES, generator=g), torch.randint(0, CLASSES, (30,), generator=g)
    plain = evaluate_masks(model, x, y)
    said = evaluate_masks(model, x, y, loss="cross_entropy", target="labels")
    assert plain.loss is None and said.loss is None
    np.testing.assert_array_equal(plain.damage(), said.damage())
    ce = plain.ce.mean(axis=1)
    np.testing.assert_array_equal(plain.damage(), ce - ce[plain.full])
    smoothed = evaluate_masks(model, x, y, loss=make_loss("cross_entropy", label_smoothing=0.1))
    want = brute_damage_smoothed(model, x, y, smoothed.masks, 0.1)
    np.testing.assert_allclose(np.asarray(smoothed.damage()), want, atol=1e-6)


def brute_damage_smoothed(model, x, y, masks, eps):
    from fathom.depth import branch_mask, dense_eval

    values = []
    with dense_eval(model), torch.no_grad():
        for row in masks:
            with branch_mask(model, tuple(int(b) for b in row)):
                values.append(reference("cross_entropy", model(x).float(), y, eps=eps))
    values = np.array(values)
    return values - values[int(np.flatnonzero(masks.all(axis=1))[0])]


def test_run_audit_measures_damage_in_the_runs_loss(tmp_path):
    from fathom.audit.checkpoint import AuditSettings
    from fathom.audit.run import audit_runs

    rd = train_run(
        run_config(data_file(tmp_path), {"name": "mse", "target": "one_hot"}), tmp_path / "r"
    )
    settings = AuditSettings(router=False, margin_bins=2, timing_batch_sizes=(4,), timing_repeats=1)
    result = audit_runs(rd.path, settings, tmp_path / "audit")
    rec = result["runs"][0]["checkpoints"]["selected"]
    assert rec["loss"]["name"] == "mse" and rec["loss"]["target"] == "one_hot"
    splits = rd.load_splits()
    model = rd.load_model(rec["epoch"], dtype=torch.float32)
    masks = np.array([[int(c) for c in m["mask"]] for m in rec["masks"]], dtype=np.uint8)
    want = brute_damage(model, splits.test_x, splits.test_y, masks, "mse")
    got = np.array([m["test"]["damage"] for m in rec["masks"]])
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert all("loss" in m["test"] for m in rec["masks"])
    agg = result["aggregate"]["selected"]
    assert agg["damage_loss"]["name"] == "mse" and agg["paired_damage"] == []
    assert "no smallest effect of interest" in agg["paired_damage_not_judged"]
    md = (tmp_path / "audit" / "audit.md").read_text()
    assert "the runs' loss (mse, mean, target one_hot)" in md and "not judged" in md
    assert "test damage (loss)" in md and "test damage (nats)" not in md
    from fathom.report.audit_view import audit_headline

    html = audit_headline(result)
    assert "Δmse (loss units)" in html and "the runs' loss, mse" in html and "ΔCE" not in html


def test_runs_of_different_losses_are_not_one_damage():
    from fathom.audit.aggregate import damage_loss

    mse = {"name": "mse", "reduction": "mean", "target": "one_hot"}
    assert damage_loss({"a": {1: {"loss": mse}}, "b": {1: {"loss": mse}}}) == mse
    assert damage_loss({"a": {1: {}}, "b": {2: {}}}) is None
    with pytest.raises(FathomError, match="audit them apart"):
        damage_loss({"a": {1: {"loss": mse}}, "b": {1: {}}})


# -- curvature --------------------------------------------------------------------------------
def test_curvature_cli_loss_flags_equal_exact_diagonals(tmp_path, capsys):
    """``--loss mse --target one_hot`` on a cross-entropy run: the saved diagonals are
    ``exact_diagonals(loss="mse")`` on one-hot targets; the run's own loss by default."""
    from fathom.curvature import exact_diagonals
    from fathom.curvature.rundir import load_diagonals

    rd = train_run(run_config(data_file(tmp_path)), tmp_path / "r")
    out = tmp_path / "curv"
    argv = ["curvature", str(rd.path), "--epochs", "1", "--probe", "16", "--save-diagonals"]
    assert main([*argv, "--out", str(out), "--loss", "mse", "--target", "one_hot"]) == 0
    record = json.loads((out / "epoch-0001.json").read_text())
    assert record["loss"] == {"name": "mse", "reduction": "mean", "target": "one_hot"}
    assert record["output_mismatch"]["rho"] is None
    got = load_diagonals(out / "epoch-0001.diagonals.safetensors")
    splits = rd.load_splits()
    x, y = splits.fit_x[:16], splits.fit_y[:16]
    model = rd.load_model(1, dtype=torch.float32)
    want = exact_diagonals(model, x, one_hot64(y), loss="mse")
    for family, per in want.items():
        for name, t in per.items():
            torch.testing.assert_close(got[family][name], t, rtol=1e-12, atol=1e-15)
    with torch.no_grad():
        model.eval()
        logits = model(x).double()
    assert record["probe_loss"] == pytest.approx(reference("mse", logits, y), rel=1e-5)
    assert "probe loss" in (out / "summary.md").read_text()
    # the default is the run's loss (cross-entropy): the full snapshot, saying so
    assert main([*argv, "--out", str(tmp_path / "ce")]) == 0
    ce = json.loads((tmp_path / "ce" / "epoch-0001.json").read_text())
    assert ce["loss"]["name"] == "cross_entropy" and ce["output_mismatch"]["rho"] is not None
    capsys.readouterr()


def test_curvature_defaults_to_the_runs_configured_loss(tmp_path, capsys):
    from fathom.curvature import exact_diagonals
    from fathom.curvature.rundir import load_diagonals

    table = {"name": "bce_with_logits", "target": "one_hot", "reduction": "sum"}
    rd = train_run(run_config(data_file(tmp_path), table), tmp_path / "r")
    out = tmp_path / "curv"
    argv = ["curvature", str(rd.path), "--epochs", "2", "--probe", "12", "--save-diagonals"]
    assert main([*argv, "--out", str(out)]) == 0
    record = json.loads((out / "epoch-0002.json").read_text())
    assert record["loss"]["name"] == "bce_with_logits" and record["loss"]["reduction"] == "sum"
    splits = rd.load_splits()
    model = rd.load_model(2, dtype=torch.float32)
    want = exact_diagonals(
        model,
        splits.fit_x[:12],
        one_hot64(splits.fit_y[:12]),
        loss=make_loss("bce_with_logits", reduction="sum"),
        families="ggn",
    )
    got = load_diagonals(out / "epoch-0002.diagonals.safetensors")
    for name, t in want["ggn"].items():
        torch.testing.assert_close(got["ggn"][name], t, rtol=1e-12, atol=1e-15)
    capsys.readouterr()


# -- the snapshot under another loss: KFAC and the gradient Grams from its directions ----------
LOSS_CASES = [
    ("mse", {}, "one_hot"),
    ("bce_with_logits", {}, "one_hot"),
    ("cross_entropy", {"label_smoothing": 0.2}, "labels"),
]


def brute_layer(model: torch.nn.Linear, x, y, name, options, target, reduction="mean"):
    """Per-example gradients ``g_i = d L_i / d W`` and the GGN of ``L`` on ``W``, float64 by
    autograd and torch.func, one example at a time: ``L = (1/N) sum_i L_i`` (mean; ``L_i``
    the example's mean over its entries for mse and BCE) or ``L = sum_i L_i`` (sum; ``L_i``
    the sum over its entries), one-hot or label targets."""
    from torch.func import hessian, jacrev

    w, b = model.weight.detach().double(), model.bias.detach().double()
    x = x.double()
    n, c = x.shape[0], w.shape[0]
    t = one_hot64(y, c) if target == "one_hot" else y
    per = c if reduction == "mean" else 1  # entries an mse / BCE example's loss averages
    fn = {
        "mse": lambda z, t: F.mse_loss(z, t, reduction="sum") / per,
        "bce_with_logits": lambda z, t: (
            F.binary_cross_entropy_with_logits(z, t, reduction="sum") / per
        ),
        "cross_entropy": lambda z, t: F.cross_entropy(z[None], t[None], **options),
    }[name]
    weight = 1 / n if reduction == "mean" else 1.0  # L = c sum_i L_i

    def z_of(wf, xi):
        return xi @ wf.T + b

    grads, ggn = [], torch.zeros(w.numel(), w.numel(), dtype=torch.float64)
    for xi, ti in zip(x, t, strict=True):
        g = jacrev(lambda wf, xi=xi, ti=ti: fn(z_of(wf, xi), ti))(w)
        grads.append(g.reshape(-1))
        jac = jacrev(lambda wf, xi=xi: z_of(wf, xi))(w).reshape(c, -1)
        h = hessian(lambda z, ti=ti: fn(z, ti))(z_of(w, xi))
        ggn += weight * (jac.T @ h @ jac)
    return torch.stack(grads), ggn


@pytest.mark.parametrize(("name", "options", "target"), LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_loss_snapshot_kfac_and_grams_are_the_losses(name, options, target):
    """On one Linear layer: the per-example gradient Gram's concentration and the exact-GGN
    Rayleigh quotient of the mean gradient equal brute force under the loss; on one example
    KFAC is exact (its diagonal error zero)."""
    from fathom.curvature.snapshot import gradient_concentration, loss_snapshot

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, CLASSES))
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(6, 4, generator=g), torch.randint(0, CLASSES, (6,), generator=g)
    loss = LabelLoss(make_loss(name, **options), target)
    snap = loss_snapshot(model, x, y, loss)
    grads, ggn = brute_layer(model[0], x, y, name, options, target)
    want = gradient_concentration(grads @ grads.T)
    got = snap.record["gradient_concentration_all_weights"]
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    gbar = grads.mean(0)
    kfac = snap.record["layers"][0]["kfac"]
    assert kfac["covered"]
    assert kfac["exact_ggn_rayleigh_mean_gradient"] == pytest.approx(
        float(gbar @ ggn @ gbar / (gbar @ gbar)), rel=1e-9
    )
    assert kfac["mean_gradient_sq_norm"] == pytest.approx(float(gbar @ gbar), rel=1e-9)
    torch.testing.assert_close(snap.diagonals["ggn"]["0.weight"].reshape(-1), ggn.diagonal())
    one = loss_snapshot(model, x[:1], y[:1], loss).record["layers"][0]["kfac"]
    assert one["kfac_diag_rel_l1_error"] == pytest.approx(0.0, abs=1e-12)


SUM_CASES = [
    ("mse", {"reduction": "sum"}, "one_hot"),
    ("bce_with_logits", {"reduction": "sum"}, "one_hot"),
    ("cross_entropy", {"reduction": "sum", "label_smoothing": 0.2}, "labels"),
]


@pytest.mark.parametrize(("name", "options", "target"), SUM_CASES, ids=[c[0] for c in SUM_CASES])
def test_loss_snapshot_with_the_sum_is_brute_force(name, options, target):
    """With ``reduction="sum"`` (``L = sum_i L_i``): the Gram of the examples' own gradients,
    the probe-mean gradient and the exact-GGN and KFAC quadratics equal a per-example float64
    loop; on one example KFAC is exact (``G (x) A`` is the GGN block: its diagonal, its
    trace ``tr G tr A`` and its quadratic along the gradient)."""
    from fathom.curvature.snapshot import gradient_concentration, loss_snapshot

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, CLASSES))
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(6, 4, generator=g), torch.randint(0, CLASSES, (6,), generator=g)
    loss = LabelLoss(make_loss(name, **options), target)
    snap = loss_snapshot(model, x, y, loss)
    grads, ggn = brute_layer(model[0], x, y, name, options, target, "sum")
    want = gradient_concentration(grads @ grads.T)
    got = snap.record["gradient_concentration_all_weights"]
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    gbar = grads.mean(0)
    kfac = snap.record["layers"][0]["kfac"]
    assert kfac["covered"] and snap.record["estimator"]["kfac"].startswith("exact factors")
    assert kfac["exact_ggn_rayleigh_mean_gradient"] == pytest.approx(
        float(gbar @ ggn @ gbar / (gbar @ gbar)), rel=1e-9
    )
    assert kfac["mean_gradient_sq_norm"] == pytest.approx(float(gbar @ gbar), rel=1e-9)
    torch.testing.assert_close(snap.diagonals["ggn"]["0.weight"].reshape(-1), ggn.diagonal())
    assert snap.record["probe_loss"] == pytest.approx(
        reference(name, model(x).detach(), y, "sum", options.get("label_smoothing", 0.0)),
        rel=1e-6,
    )
    one = loss_snapshot(model, x[:1], y[:1], loss).record["layers"][0]["kfac"]
    g1, ggn1 = brute_layer(model[0], x[:1], y[:1], name, options, target, "sum")
    assert one["kfac_diag_rel_l1_error"] == pytest.approx(0.0, abs=1e-12)
    assert one["A"]["trace"] * one["G"]["trace"] == pytest.approx(float(ggn1.trace()), rel=1e-9)
    assert one["kfac_quadratic_mean_gradient"] == pytest.approx(
        float(g1[0] @ ggn1 @ g1[0]), rel=1e-9
    )


def test_loss_snapshot_sum_is_n_times_the_mean_per_example():
    """Cross-entropy on integer labels has the same ``L_i`` under both reductions, so the
    sum's snapshot holds the same per-example gradients (Gram moments, mean gradient) and
    ``N`` times the mean's GGN: KFAC's ``G`` ``N`` times (``A`` the same), the exact-GGN and
    KFAC quadratics along the same mean gradient ``N`` times."""
    from fathom.curvature.snapshot import loss_snapshot

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    g = torch.Generator().manual_seed(2)
    n = 7
    x, y = torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)
    mean, total = (
        loss_snapshot(model, x, y, LabelLoss(make_loss("cross_entropy", reduction=r), "labels"))
        for r in ("mean", "sum")
    )
    for key, value in mean.record["gradient_concentration_all_weights"].items():
        assert total.record["gradient_concentration_all_weights"][key] == pytest.approx(
            value, rel=1e-9
        )
    for lm, ls in zip(mean.record["layers"], total.record["layers"], strict=True):
        km, ks = lm["kfac"], ls["kfac"]
        assert ks["A"]["trace"] == pytest.approx(km["A"]["trace"], rel=1e-12)
        assert ks["G"]["trace"] == pytest.approx(n * km["G"]["trace"], rel=1e-9)
        assert ks["mean_gradient_sq_norm"] == pytest.approx(km["mean_gradient_sq_norm"], rel=1e-9)
        assert ks["kfac_quadratic_mean_gradient"] == pytest.approx(
            n * km["kfac_quadratic_mean_gradient"], rel=1e-9
        )
        assert ks["kfac_rayleigh_per_example"] == pytest.approx(
            [n * q for q in km["kfac_rayleigh_per_example"]], rel=1e-9
        )
        assert ks["kfac_diag_rel_l1_error"] == pytest.approx(km["kfac_diag_rel_l1_error"], rel=1e-9)


# -- reports of a run trained with a [loss] table ----------------------------------------------
def test_report_of_a_loss_run_shows_its_loss(tmp_path):
    """``fathom report`` of an mse run: summary.md's training-loss table holds the selected
    epoch and ``val/loss`` the manifest and history record (the loss's own numbers, not CE's),
    the learning curves gain the loss's row, the explorer offers ``{split}/loss``, and the
    progress line says the loss; a default run's report has none of it."""
    from PIL import Image

    from fathom.base.terminal import _epoch_line
    from fathom.report.build import build_report

    npz = data_file(tmp_path)
    mse = train_run(run_config(npz, {"name": "mse", "target": "one_hot"}), tmp_path / "m" / "r")
    plain = train_run(run_config(npz), tmp_path / "p" / "r")
    out = build_report(tmp_path / "m")
    md = out.summary_md.read_text()
    rows = history(mse)
    sel = mse.manifest["selected"]
    last = rows[-1]
    want = (
        f"| {mse.run_id} | mse (reduction mean, target one_hot) | {sel['epoch']} | "
        f"{sel['val_loss']:.6g} | {last['val/loss']:.6g} | {last['test/loss']:.6g} "
        f"| {last['epoch']} |"
    )
    assert "## Training loss" in md and want in md
    assert '"{split}/loss"' in (out.html.parent / "report.html").read_text()
    base = build_report(tmp_path / "p")
    assert "## Training loss" not in base.summary_md.read_text()
    # learning_curves.png: three rows of panels (accuracy, CE, the loss) against two
    heights = [
        Image.open(o.html.parent / "figures" / "learning_curves.png").size[1] for o in (out, base)
    ]
    assert heights[0] > 1.3 * heights[1]
    line = _epoch_line(last, None)
    assert f"loss {last['val/loss']:.4g}" in line
    assert " loss " not in _epoch_line(history(plain)[-1], None).split("val acc")[1]


def test_an_interrupted_loss_run_resumes_to_the_same_selection(tmp_path, monkeypatch):
    """Ctrl-C at the boundary of epoch 3 of an mse run, then a resume: the same selected
    epoch, ``val_loss`` and weights, and the same final parameters, as the run unbroken."""
    import fathom.train.loop as loop
    from fathom.train.loop import train

    cfg = run_config(
        data_file(tmp_path),
        {"name": "mse", "target": "one_hot"},
        optim={"lr": 0.05, "batch_size": 16, "epochs": 4},
    )
    whole = train_run(cfg, tmp_path / "whole")
    real = loop.observe

    def stop_at_3(s, epoch, fields):
        if epoch == 3:
            raise KeyboardInterrupt
        return real(s, epoch, fields)

    monkeypatch.setattr(loop, "observe", stop_at_3)
    with pytest.raises(KeyboardInterrupt):  # recorded as interrupted, then raised on
        train(cfg, tmp_path / "cut")
    assert RunDir(tmp_path / "cut").status != "complete"
    monkeypatch.setattr(loop, "observe", real)
    assert train(cfg, tmp_path / "cut", resume=True).status == "complete"
    cut = RunDir(tmp_path / "cut")
    assert cut.manifest["selected"] == whole.manifest["selected"]
    assert "val_loss" in cut.manifest["selected"]
    sel = "selected_checkpoint"
    assert cut.manifest[sel]["params_sha256"] == whole.manifest[sel]["params_sha256"]
    assert cut.manifest["hashes"]["final_params"] == whole.manifest["hashes"]["final_params"]
