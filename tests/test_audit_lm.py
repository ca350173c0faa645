"""The layer-removal audit of a language model (``fathom audit`` on a ``gpt`` run) against
brute force: each reduced network's nats/token computed by literally deleting its blocks
from a float64 copy of the model; FLOPs against the hand count of its products; the greedy
path against a brute-force greedy search; interactions against their definitions; the
sentences against their verdicts."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fathom.audit.checkpoint import AuditSettings
from fathom.audit.costs import mask_costs
from fathom.audit.run import audit_runs
from fathom.audit.tokens import chunk_bounds, lattice_interactions, pair_interactions
from fathom.cli import main
from fathom.config import validate_run_config
from fathom.errors import FathomError
from fathom.models.gpt import GPT
from fathom.rundir import RunDir
from fathom.stats.audit_sentences import VERDICT_WORDS
from fathom.train.loop import train
from test_audit_interactions import brute_zeta

TEXT = (
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no "
    "money in my purse, I thought I would sail about a little and see the watery part.\n"
) * 14


def lm_config(corpus: Path, layers: int = 3):
    return validate_run_config(
        {
            "name": "lm",
            "study": "test",
            "seed": 1,
            "device": "cpu",
            "data": {"dataset": "text", "path": str(corpus), "context": 16},
            "model": {"kind": "gpt", "layers": layers, "width": 16, "heads": 2, "layerdrop": 0.2},
            "optim": {
                "name": "adamw",
                "lr": 1e-2,
                "batch_size": 8,
                "epochs": 2,
                "schedule": {"kind": "warmup_cosine", "warmup_epochs": 0.5, "final": 0.1},
            },
            "eval": {"every": 1, "batch_size": 16},
            "execution": {"path": "eager", "precision": "fp32"},
        }
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lm")
    corpus = root / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    return Path(train(lm_config(corpus), root / "run").run_dir)


@pytest.fixture(scope="module")
def audited(trained, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("audit")
    return audit_runs(trained, AuditSettings(router=False, checkpoints=("final",)), out)


def reduced_ce(model: GPT, kept: list[int], x: torch.Tensor, y: torch.Tensor) -> float:
    """Brute force: a float64 copy of the model with the removed blocks deleted."""
    net = copy.deepcopy(model).double().eval()
    net.blocks = torch.nn.ModuleList(net.blocks[i] for i in kept)
    with torch.no_grad():
        z = net(x)
    return float(F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1).long()))


def _rec(result: dict) -> dict:
    (run,) = result["runs"]
    return run["checkpoints"]["final"]


def test_every_reduced_network_scores_as_its_blocks_deleted(trained, audited):
    rd = RunDir(trained)
    model = rd.load_model("final", dtype=torch.float32)
    splits = rd.load_splits("cpu")
    rec = _rec(audited)
    assert rec["coverage"]["masks_evaluated"] == rec["coverage"]["masks_total"] == 8
    assert audited["model"] == "language model"
    for m in rec["masks"]:
        kept = [i for i, c in enumerate(m["mask"]) if c == "1"]
        for split in ("val", "test"):
            x, y = getattr(splits, f"{split}_x"), getattr(splits, f"{split}_y")
            ref = reduced_ce(model, kept, x, y)
            assert m[split]["ce"] == pytest.approx(ref, abs=2e-5)
            assert m[split]["ppl"] == pytest.approx(math.exp(ref), rel=5e-5)
    full = next(m for m in rec["masks"] if m["mask"] == "111")
    assert full["test"]["damage"] == 0.0 and full["flops_fraction"] == 1.0
    # it learned: the full network beats the empty one
    empty = next(m for m in rec["masks"] if m["mask"] == "000")
    assert full["val"]["ce"] < empty["val"]["ce"]


def gpt_flops(t: int, d: int, v: int, kept: int) -> int:
    """Hand count of one window: per block QKV, attention (QK^T and AV, causal counted in
    full as torch does), output projection, MLP; then the tied head."""
    block = 2 * t * d * 3 * d + 2 * 2 * t * t * d + 2 * t * d * d + 2 * (2 * t * d * 4 * d)
    return kept * block + 2 * t * d * v


def test_flops_per_mask_are_the_hand_count_of_attention_and_mlp(audited):
    rec = _rec(audited)
    for m in rec["masks"]:
        want = gpt_flops(16, 16, 256, m["kept"])
        assert m["flops_per_token"] * 16 == want


def test_attention_written_with_bmm_and_baddbmm_is_counted():
    class BmmGPT(GPT):
        pass

    model = BmmGPT(vocab=32, context=8, layers=2, width=8, heads=2)
    for blk in model.blocks:
        attn = blk.branch.attn

        def manual(x, attn=attn):
            n, t, d = x.shape
            q, k, v = attn.c_attn(x).split(d, dim=2)
            s = torch.baddbmm(torch.zeros(n, t, t), q, k.transpose(1, 2), alpha=d**-0.5)
            return attn.c_proj(torch.bmm(torch.softmax(s, -1), v))

        attn.forward = manual
    x = torch.randint(0, 32, (1, 8))
    got = mask_costs(model, x, np.array([[1, 1], [0, 1], [0, 0]]))
    per_block = 2 * 8 * 8 * 24 + 2 * 8 * 8 * 8 * 2 + 2 * 8 * 8 * 8 + 2 * (2 * 8 * 8 * 32)
    head = 2 * 8 * 8 * 32
    assert got.tolist() == [2 * per_block + head, per_block + head, head]


def test_beyond_the_budget_the_scheme_is_singles_pairs_and_greedy(trained, tmp_path):
    res = audit_runs(
        trained, AuditSettings(router=False, checkpoints=("final",), token_max_masks=4), tmp_path
    )
    rec = _rec(res)
    cov = rec["coverage"]
    assert not cov["enumerated"] and cov["masks_total"] == 8
    labels = {m["mask"] for m in rec["masks"]}
    singles = {"011", "101", "110"}
    pairs = {"001", "010", "100"}
    assert {"111"} | singles | pairs <= labels
    assert cov["masks_evaluated"] == len(labels) == 8  # greedy's last step adds the empty one
    assert "greedy" in cov["text"] and "8 of 8" in cov["text"]
    assert rec["interactions"]["lattice"] is None
    # greedy path = brute-force greedy on validation CE
    val = {m["mask"]: m["val"]["ce"] for m in rec["masks"]}
    removed: list[int] = []
    for step in rec["greedy"]:
        options = [b for b in range(3) if b not in removed]
        cand = {
            b: "".join("0" if i in removed or i == b else "1" for i in range(3)) for b in options
        }
        best = min(options, key=lambda b: (val[cand[b]], b))
        assert step["removed"] == best and step["mask"] == cand[best]
        removed.append(best)


def test_interactions_are_the_mobius_coefficients_in_nats(audited):
    rec = _rec(audited)
    ce = {m["mask"]: m["test"]["ce"] for m in rec["masks"]}
    lat = rec["interactions"]["lattice"]
    assert sum(lat["sum_by_order"][1:]) == pytest.approx(ce["111"] - ce["000"], abs=1e-12)
    # the pair around the full network from its definition
    dmg = {k: v - ce["111"] for k, v in ce.items()}
    for p in rec["interactions"]["pairs_around_full"]:
        b, j = p["blocks"]
        both = "".join("0" if i in (b, j) else "1" for i in range(3))
        one = "".join("0" if i == b else "1" for i in range(3))
        two = "".join("0" if i == j else "1" for i in range(3))
        assert p["interaction"] == pytest.approx(dmg[both] - dmg[one] - dmg[two], abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.data())
def test_lattice_coefficients_rebuild_the_ce_and_vanish_when_additive(layers, data):
    labels = ["".join(str((m >> b) & 1) for b in range(layers)) for m in range(1 << layers)]
    vals = data.draw(st.lists(st.floats(0, 10), min_size=1 << layers, max_size=1 << layers))
    ce = dict(zip(labels, vals))
    lat = lattice_interactions(ce, layers)
    g = np.zeros(1 << layers)
    g[0] = lat["empty_ce"]
    for c in lat["coefficients"]:
        g[sum(1 << b for b in c["blocks"])] = c["g"]
    assert np.allclose(brute_zeta(g), vals, atol=1e-9)
    # additive over blocks: no interaction of order >= 2, around the full network either
    a = data.draw(st.lists(st.floats(-1, 1), min_size=layers, max_size=layers))
    add = {lab: 2.0 + sum(a[b] for b in range(layers) if lab[b] == "1") for lab in labels}
    lat = lattice_interactions(add, layers)
    assert all(abs(v) < 1e-9 for v in lat["abs_by_order"][2:])
    if layers >= 2:
        full = add["1" * layers]
        pairs = pair_interactions({k: v - full for k, v in add.items()}, layers)
        assert all(abs(p["interaction"]) < 1e-9 for p in pairs)


def test_the_sentences_follow_the_judged_intervals(audited):
    rec = _rec(audited)
    delta = rec["smallest_effect_nats"]
    for s, sentence in zip(rec["singles"], rec["sentences"]):
        v = s["verdict"]
        assert sentence.startswith(f"block {s['block']} {s['words']}")
        assert s["words"] == VERDICT_WORDS.get(v["verdict"], "not established")
        d = v["diff"]
        if v["verdict"] == "equivalent":
            assert -delta <= d["low"] and d["high"] <= delta
        if v["verdict"] == "worse":
            assert d["low"] > delta
    greedy = rec["sentences"][-1]
    first = rec["greedy"][0]["verdict"]["verdict"]
    assert ("can go together" in greedy) == (first == "equivalent")


def test_chunks_cover_every_window_once():
    for w in (1, 5, 20, 57):
        b = chunk_bounds(w)
        assert b[0] == 0 and b[-1] == w and np.all(np.diff(b) >= 1)
        assert len(b) - 1 == min(20, w)
    with pytest.raises(FathomError, match="no window"):
        chunk_bounds(0)


def test_the_cli_writes_the_lm_audit_and_prints_its_sentences(trained, tmp_path, capsys):
    out = tmp_path / "a"
    assert main(["audit", str(trained), "--out", str(out), "--quiet", "--no-router"]) == 0
    printed = capsys.readouterr().out
    assert "block 0 " in printed and "greedy" in printed
    md = (out / "audit.md").read_text()
    assert "Layer-removal audit of a language model" in md and "Greedy ordered removal" in md
    data = json.loads((out / "audit.json").read_text())
    assert data["model"] == "language model"
    assert main(["audit", str(trained), "--out", str(tmp_path / "b"), "--sample-masks", "5"]) == 2
    assert "drop --sample-masks" in capsys.readouterr().err


def test_the_report_shows_the_curves_the_audit_and_the_sentences(trained, tmp_path):
    from fathom.report.build import build_report

    audit_runs(trained, AuditSettings(router=False, checkpoints=("final",)))  # into run/audit
    out = build_report(trained, tmp_path / "report")
    md = out.summary_md.read_text()
    assert "## Language model" in md and "nats/token and perplexity by epoch" in md.replace(
        "nats per token", "nats/token"
    )
    rows = RunDir(trained).history()
    last = rows[-1]
    assert f"{last['val/ce']:.4f}" in md  # the curve's numbers are the history's
    rec = json.loads((trained / "audit" / "audit.json").read_text())["runs"][0]["checkpoints"]
    for sentence in rec["final"]["sentences"]:
        assert sentence in md
    names = {p.name for p in out.figures}
    assert {"lm_curves.png", "lm_removal.png"} <= names
    assert out.html.exists()


def test_the_scheme_covers_full_singles_pairs_and_the_greedy_path_at_depth_8():
    """1 + 8 + 28 masks, then greedy steps 3..8 add 6 + 5 + ... + 1 new ones: 58 of 256."""
    from fathom.audit.tokens import MaskEvaluator, plan_and_evaluate, planned_masks

    torch.manual_seed(0)
    model = GPT(vocab=16, context=4, layers=8, width=4, heads=1).eval()
    x = torch.randint(0, 16, (3, 4))
    ev = MaskEvaluator(model, {"val": (x, x), "test": (x, x)}, batch_size=8)
    with torch.no_grad():
        plan = plan_and_evaluate(ev, 8, max_masks=64)
    assert plan["coverage"]["masks_evaluated"] == 58 == len(set(ev.order))
    assert planned_masks(8, 64) == 58 and planned_masks(3, 4) == 8 and planned_masks(6, 64) == 64
    assert plan["coverage"]["text"].startswith("58 of 256 masks")
    assert [p["step"] for p in plan["greedy"]] == list(range(1, 9))
    assert sorted(p["removed"] for p in plan["greedy"]) == list(range(8))


def test_a_model_whose_output_is_not_n_t_v_is_refused_naming_the_layout():
    from fathom.audit.lm import lm_audit_checkpoint
    from fathom.depth import SkippableResidual

    class Pooled(torch.nn.Module):  # [N, V]: a classifier's layout, not next-token logits
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(16, 4)
            self.block = SkippableResidual(torch.nn.Linear(4, 4))
            self.head = torch.nn.Linear(4, 16)

        def forward(self, x):
            return self.head(self.block(self.emb(x.long())).mean(1))

    x = torch.randint(0, 16, (4, 5))

    class Splits:
        val_x = test_x = x
        val_y = test_y = x.long()

    with pytest.raises(FathomError, match=r"next-token logits \[N, T, V\]"):
        lm_audit_checkpoint(Pooled(), Splits, max_masks=64)

    class Flat(Splits):
        val_x = x.reshape(-1)

    with pytest.raises(FathomError, match=r"token windows \[W, T\]"):
        lm_audit_checkpoint(Pooled(), Flat, max_masks=64)
