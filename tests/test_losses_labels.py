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


def brute_layer(model: torch.nn.Linear, x, y, name, options, target):
    """Per-example gradients ``g_i = d L_i / d W`` and the GGN of ``L`` on ``W``, float64 by
    autograd and torch.func (``L = (1/N) sum_i L_i``, one-hot or label targets)."""
    from torch.func import hessian, jacrev

    w, b = model.weight.detach().double(), model.bias.detach().double()
    x = x.double()
    n, c = x.shape[0], w.shape[0]
    t = one_hot64(y, c) if target == "one_hot" else y
    fn = {
        "mse": lambda z, t: F.mse_loss(z, t, reduction="sum") / c,
        "bce_with_logits": lambda z, t: (
            F.binary_cross_entropy_with_logits(z, t, reduction="sum") / c
        ),
        "cross_entropy": lambda z, t: F.cross_entropy(z[None], t[None], **options),
    }[name]

    def z_of(wf, xi):
        return xi @ wf.T + b

    grads, ggn = [], torch.zeros(w.numel(), w.numel(), dtype=torch.float64)
    for xi, ti in zip(x, t, strict=True):
        g = jacrev(lambda wf, xi=xi, ti=ti: fn(z_of(wf, xi), ti))(w)
        grads.append(g.reshape(-1))
        jac = jacrev(lambda wf, xi=xi: z_of(wf, xi))(w).reshape(c, -1)
        h = hessian(lambda z, ti=ti: fn(z, ti))(z_of(w, xi))
        ggn += jac.T @ h @ jac / n
    return torch.stack(grads), ggn


@pytest.mark.parametrize(("name", "options", "target"), LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_loss_snapshot_kfac_and_grams_are_the_losses(name, options, target):
    """On one Linear layer: the per-example gradient Gram's concentration and the exact-GGN
    Rayleigh quotient of the mean gradient equal brute force under the loss; on one example
    KFAC is exact (its diagonal error zero)."""
    from fathom.curvature.concentration import gradient_concentration
    from fathom.curvature.snapshot import loss_snapshot

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


def test_loss_snapshot_with_the_sum_states_what_it_leaves_out():
    from fathom.curvature.snapshot import loss_snapshot

    torch.manual_seed(0)
    model = torch.nn.Linear(4, CLASSES)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    loss = LabelLoss(make_loss("mse", reduction="sum"), "one_hot")
    snap = loss_snapshot(model, x, y, loss)
    layer = snap.record["layers"][0]
    assert not layer["kfac"]["covered"] and "per-example means" in layer["kfac"]["reason"]
    assert snap.record["gradient_concentration_all_weights"] is None
    assert snap.record["probe_loss"] == pytest.approx(
        reference("mse", model(x).detach(), y, "sum"), rel=1e-6
    )
