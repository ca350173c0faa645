"""A language model's curvature: token cross-entropy's GGN diagonal exact against a float64
brute force, Monte-Carlo within its standard error, ``auto`` naming its choice under a stated
budget, and ``fathom curvature`` on a trained gpt run recording estimator, samples and seed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call, jacrev

from fathom.cli import main
from fathom.curvature.estimate import Budget
from fathom.curvature.language import block_of, token_diagonals, token_snapshot
from fathom.errors import FathomError
from fathom.models.gpt import GPT, IGNORE_INDEX, token_loss
from fathom.rundir import RunDir
from fathom.train.loop import train


def tiny(seed: int = 0, vocab: int = 7, context: int = 4):
    torch.manual_seed(seed)
    model = GPT(vocab, context, 2, 8, 2)
    x = torch.randint(0, vocab, (3, context))
    y = torch.randint(0, vocab, (3, context))
    y[0, 1] = IGNORE_INDEX  # an ignored position: M counts the valid ones only
    return model, x, y


def brute_ggn(model, x, y) -> dict[str, torch.Tensor]:
    """``(1/M) sum_{valid (i,t)} diag(J_it^T (diag p - p p^T) J_it)`` in float64, one
    position's full Jacobian at a time (torch.func over the named parameters)."""
    m64 = copy.deepcopy(model).double().eval()
    params = {k: v.detach() for k, v in m64.named_parameters()}
    valid = y != IGNORE_INDEX
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for i in range(x.shape[0]):

        def logits(p, i=i):
            return functional_call(m64, p, (x[i : i + 1],))[0]  # [T, V]

        jac = jacrev(logits)(params)  # {name: [T, V, *shape]}
        z = logits(params).detach()
        for t in range(x.shape[1]):
            if not valid[i, t]:
                continue
            p = torch.softmax(z[t], -1)
            h = torch.diag(p) - torch.outer(p, p)
            for k, j in jac.items():
                jt = j[t].reshape(j.shape[1], -1)  # [V, P]
                total[k] += torch.einsum("vp,vw,wp->p", jt, h, jt).reshape(total[k].shape)
    m = int(valid.sum())
    return {k: v / m for k, v in total.items()}


def test_exact_ggn_diagonal_is_the_brute_force():
    model, x, y = tiny()
    est = token_diagonals(model, x, y, loss=token_loss(), estimator="exact")
    want = brute_ggn(model, x, y)
    assert est.estimators == {"ggn": "exact", "empirical_fisher": "exact"}
    assert est.samples is None and est.seed is None
    for k, v in want.items():
        torch.testing.assert_close(est.diagonals["ggn"][k], v, rtol=1e-9, atol=1e-13)


@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    vocab=st.integers(3, 9),
    context=st.integers(2, 5),
    ignored=st.integers(0, 3),
)
def test_exact_is_the_brute_force_on_generated_models(seed, vocab, context, ignored):
    """Generated vocabularies, contexts and ignored positions (the first ``ignored`` positions
    of window 1): the exact path against the float64 brute force, and MC within 5 SE."""
    model, x, y = tiny(seed, vocab, context)
    y[1, :ignored] = IGNORE_INDEX
    est = token_diagonals(model, x, y, loss=token_loss(), estimator="exact")
    want = brute_ggn(model, x, y)
    for k, v in want.items():
        torch.testing.assert_close(est.diagonals["ggn"][k], v, rtol=1e-9, atol=1e-13)
    mc = token_diagonals(model, x, y, loss=token_loss(), estimator="mc", samples=16, seed=seed)
    exact = sum(float(v.sum()) for v in want.values())
    assert abs(mc.traces["ggn"] - exact) <= 5 * mc.trace_standard_errors["ggn"]


def test_monte_carlo_meets_the_exact_value_within_its_standard_error():
    model, x, y = tiny(seed=1)
    exact = token_diagonals(model, x, y, loss=token_loss(), estimator="exact")
    mc = token_diagonals(model, x, y, loss=token_loss(), estimator="mc", samples=32, seed=5)
    assert mc.estimators == {"ggn": "mc", "empirical_fisher": "exact"}
    assert (mc.samples, mc.seed) == (32, 5)
    se = mc.trace_standard_errors["ggn"]
    assert 0 < se < 0.2 * exact.traces["ggn"]
    assert abs(mc.traces["ggn"] - exact.traces["ggn"]) <= 4 * se
    z = [
        (mc.parameter_traces["ggn"][p] - exact.parameter_traces["ggn"][p]) / s
        for p, s in mc.parameter_trace_standard_errors["ggn"].items()
        if s > 0
    ]
    assert len(z) > 10 and max(abs(v) for v in z) < 5  # no parameter's trace far off
    # the empirical Fisher stays exact under MC
    for p, v in exact.diagonals["empirical_fisher"].items():
        torch.testing.assert_close(mc.diagonals["empirical_fisher"][p], v, rtol=1e-10, atol=0)
    # the same seed draws the same estimate
    again = token_diagonals(model, x, y, loss=token_loss(), estimator="mc", samples=32, seed=5)
    assert again.traces == mc.traces


def test_auto_names_its_choice_under_the_budget():
    model, x, y = tiny()
    fits = token_diagonals(model, x, y, loss=token_loss())
    # T (V - 1) + 1 = 4 * 6 + 1 = 25 directions per window for the GGN and the Fisher
    assert fits.estimators["ggn"] == "exact" and "25 directions per example" in fits.choice
    tight = token_diagonals(
        model, x, y, loss=token_loss(), samples=4, seed=2, budget=Budget(backward_passes=10)
    )
    assert tight.estimators["ggn"] == "mc" and tight.choice.startswith("auto chose mc")
    assert (tight.samples, tight.seed) == (4, 2)
    with pytest.raises(FathomError, match="no curvature estimator fits the budget"):
        token_diagonals(model, x, y, loss=token_loss(), budget=Budget(backward_passes=1))


def test_refusals_name_the_fix():
    model, x, y = tiny()
    with pytest.raises(FathomError, match="did you mean 'exact'"):
        token_diagonals(model, x, y, loss=token_loss(), estimator="exakt")
    with pytest.raises(FathomError, match="token_loss"):
        token_diagonals(model, x, y, loss=token_loss().__class__(class_dim=1))
    with pytest.raises(FathomError, match="every target position is ignored"):
        token_diagonals(model, x, torch.full_like(y, IGNORE_INDEX), loss=token_loss())
    with pytest.raises(FathomError, match="at least 2 samples"):
        token_diagonals(model, x, y, loss=token_loss(), estimator="hutchinson", samples=1)


def test_the_snapshot_sums_traces_per_block():
    model, x, y = tiny()
    rec = token_snapshot(model, x, y, loss=token_loss(), estimator="exact")
    blocks = {b["block"]: b for b in rec["blocks"]}
    assert set(blocks) == {"wte", "wpe", "blocks.0", "blocks.1", "ln_f"}
    assert sum(b["ggn_trace"] for b in blocks.values()) == pytest.approx(rec["traces"]["ggn"])
    want = sum(
        float(v.sum()) for k, v in brute_ggn(model, x, y).items() if block_of(k) == "blocks.1"
    )
    assert blocks["blocks.1"]["ggn_trace"] == pytest.approx(want, rel=1e-9)
    assert rec["positions"] == 11 and rec["vocab"] == 7
    assert rec["estimator"]["ggn"] == "exact" and rec["samples"] is None


TEXT = "Call me Ishmael. Some years ago, never mind how long precisely, I went to sea.\n" * 10


def _gpt_run(tmp_path: Path) -> Path:
    from fathom.config import validate_run_config

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    cfg = validate_run_config(
        {
            "name": "lm",
            "study": "test",
            "seed": 3,
            "device": "cpu",
            "data": {"dataset": "text", "path": str(corpus), "context": 8},
            "model": {"kind": "gpt", "layers": 2, "width": 8, "heads": 2},
            "optim": {"name": "adamw", "lr": 3e-3, "batch_size": 8, "epochs": 1},
            "checkpoints": {"save_epochs": [0, 1]},
            "execution": {"path": "eager", "precision": "fp32"},
        }
    )
    return train(cfg, tmp_path / "run").run_dir


def test_fathom_curvature_on_a_language_model_run(tmp_path, capsys):
    run = _gpt_run(tmp_path)
    # V = 256 bytes: T (V - 1) + 1 = 2041 directions fit the default 2048 passes, not 1000
    rc = main(["curvature", str(run), "--epochs", "1", "--probe", "3"])
    assert rc == 0 and "GGN estimator" in capsys.readouterr().out
    rec = json.loads((Path(run) / "curvature" / "epoch-0001.json").read_text())
    assert rec["estimator"] == {"ggn": "exact", "empirical_fisher": "exact"}
    assert rec["choice"].startswith("auto chose exact") and rec["probe_size"] == 3
    assert rec["checkpoint"]["verified"] and rec["positions"] == 24
    rd = RunDir(run)
    model = rd.load_model(1)
    splits = rd.load_splits()
    x, y = splits.fit_x[:3], splits.fit_y[:3]
    want = token_diagonals(model, x, y, loss=token_loss(), estimator="exact").traces["ggn"]
    assert rec["traces"]["ggn"] == pytest.approx(want, rel=1e-12)
    mc_args = ["--budget-passes", "1000", "--samples", "3", "--seed", "9"]
    rc = main(
        [
            "curvature",
            str(run),
            "--epochs",
            "1",
            "--probe",
            "3",
            "--out",
            str(tmp_path / "mc"),
            *mc_args,
        ]
    )
    assert rc == 0
    mc = json.loads((tmp_path / "mc" / "epoch-0001.json").read_text())
    assert mc["estimator"]["ggn"] == "mc" and (mc["samples"], mc["seed"]) == (3, 9)
    assert abs(mc["traces"]["ggn"] - want) <= 5 * mc["trace_standard_errors"]["ggn"]
    summary = json.loads((tmp_path / "mc" / "summary.json").read_text())
    assert summary["rows"][0]["estimator"] == "mc" and summary["rows"][0]["seed"] == 9


def test_a_sampled_estimator_is_refused_on_a_classifier_run(tmp_path):
    from fathom.curvature.rundir import Estimating, run_curvature
    from test_curvature_cli import make_run

    rd = RunDir(make_run(tmp_path))
    with pytest.raises(FathomError, match="classifier run's curvature snapshot is exact"):
        run_curvature(rd, [0], probe=4, estimator=Estimating(name="mc"))
    assert not (rd.path / "curvature").exists()
