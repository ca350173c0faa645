"""Training a language model (``model.kind = "gpt"`` on text) end to end, at tiny size: the
run directory, per-token scores and perplexity, clipping records, LayerDrop's masks, the
refusals, determinism, and resume after SIGKILL ending on the uninterrupted run's hash."""

from __future__ import annotations

import math
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from fathom.base.io import read_jsonl
from fathom.cli import main
from fathom.config import validate_run_config
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.train.loop import train

TEXT = (
    "It is not down in any map; true places never are. Whenever I find myself growing grim "
    "about the mouth, I account it high time to get to sea as soon as I can.\n"
) * 12


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def lm_config(corpus: Path, **updates):
    data = {
        "name": "lm",
        "study": "test",
        "seed": 3,
        "device": "cpu",
        "data": {"dataset": "text", "path": str(corpus), "context": 16},
        "model": {"kind": "gpt", "layers": 2, "width": 16, "heads": 2, "layerdrop": 0.3},
        "optim": {
            "name": "adamw",
            "lr": 3e-3,
            "betas": [0.9, 0.95],
            "weight_decay": 0.1,
            "clip_norm": 0.5,
            "batch_size": 8,
            "epochs": 3,
            "schedule": {"kind": "warmup_cosine", "warmup_epochs": 0.5, "final": 0.1},
        },
        "eval": {"every": 1, "batch_size": 16},
        "execution": {"path": "eager", "precision": "fp32"},
    }
    cfg = validate_run_config(data)
    return cfg.with_updates(updates) if updates else cfg


def test_a_language_model_run_records_tokens_perplexity_and_clipping(tmp_path, corpus):
    res = train(lm_config(corpus), tmp_path / "r")
    assert res.status == "complete"
    rd = RunDir(res.run_dir)
    m = rd.manifest
    assert m["model"]["kind"] == "gpt" and m["model"]["class"] == "GPT"
    info = m["data"]["info"]
    assert info["vocab"] == 256 and info["context"] == 16 and info["mode"] == "text-contiguous"
    assert m["data"]["files"] == {"corpus.txt": rd.manifest["data"]["files"]["corpus.txt"]}
    rows = rd.history()
    for row in rows:
        for split in ("fit", "val", "test"):
            assert row[f"{split}/ppl"] == pytest.approx(math.exp(row[f"{split}/ce"]))
            assert 0 <= row[f"{split}/acc"] <= 1
    trained = rows[1:]
    assert all(r["optim/grad_norm_max"] >= r["optim/grad_norm_mean"] > 0 for r in trained)
    assert all(0 <= r["optim/clipped_frac"] <= 1 for r in trained)
    assert "optim/grad_norm_mean" not in rows[0]
    assert rows[-1]["val/ce"] < rows[0]["val/ce"]  # it learns (a repeated sentence)
    assert (
        m["hashes"]["masks"]
        != RunDir(
            train(lm_config(corpus, **{"model.layerdrop": 0.0}), tmp_path / "dense").run_dir
        ).manifest["hashes"]["masks"]
    )


def test_the_same_config_twice_is_byte_identical(tmp_path, corpus):
    a = train(lm_config(corpus, **{"optim.epochs": 2}), tmp_path / "a")
    b = train(lm_config(corpus, **{"optim.epochs": 2}), tmp_path / "b")
    assert a.final_params == b.final_params is not None


def test_clipping_bounds_the_applied_gradient(tmp_path, corpus):
    """With a tiny clip norm every step is clipped (the recorded fraction is one)."""
    res = train(lm_config(corpus, **{"optim.clip_norm": 1e-6, "optim.epochs": 1}), tmp_path / "c")
    assert res.history[-1]["optim/clipped_frac"] == 1.0


def _telemetry(corpus: Path, **updates):
    tel = {"telemetry.probe_size": 6, "telemetry.first": [0, 2], "telemetry.every": 5}
    return lm_config(corpus, **{"optim.epochs": 2, **tel, **updates})


def test_telemetry_leaves_a_language_model_run_byte_identical(tmp_path, corpus):
    """Epoch-boundary telemetry (every family that applies) changes no training number."""
    off = train(_telemetry(corpus), tmp_path / "off")
    on = train(_telemetry(corpus), tmp_path / "on", telemetry=True)
    assert on.final_params == off.final_params is not None
    assert [r["val/ce"] for r in on.history] == [r["val/ce"] for r in off.history]


def test_a_language_model_run_records_per_block_telemetry(tmp_path, corpus):
    res = train(_telemetry(corpus), tmp_path / "on", telemetry=True)
    m = RunDir(res.run_dir).manifest
    names = [la["name"] for la in m["telemetry"]["layers"]]
    for block in (0, 1):  # every skippable block's attention and MLP layers, by path
        for part in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            assert f"blocks.{block}.branch.{part}" in names
    assert set(m["telemetry"]["families_left_out"]) == {"probe", "scores"}
    rows = {r["epoch"]: r for r in res.history}
    row = rows[2]
    for block in (0, 1):
        layer = f"blocks.{block}.branch.mlp.c_fc"
        assert row[f"param/weight_norm/{layer}"] > 0
        assert row[f"param/disp/{layer}"] > 0 == rows[0][f"param/disp/{layer}"]
        assert row[f"grad/mean/weight_norm/{layer}"] > 0
        assert row[f"grad/pex/diversity/{layer}"] > 0
    assert not any(k.startswith(("probe/ce", "split/")) for k in row)
    # one field per block, read back from the run directory's history
    stored = {r["epoch"]: r for r in RunDir(res.run_dir).history()}
    for block in (0, 1):
        for name in (
            f"probe/block/update_rel/blocks.{block}",
            f"grad/block/mean_norm/blocks.{block}",
        ):
            assert stored[2][name] == row[name] and stored[0][name] > 0


def test_telemetry_reads_the_token_loss(corpus):
    """The probe's mean gradient is the gradient of the token cross-entropy averaged over the
    windows (float64 reference: autograd of the per-window means, averaged)."""
    from fathom.config import TelemetryConfig
    from fathom.data.text import prepare_text
    from fathom.models.gpt import GPT, token_cross_entropy, token_loss
    from fathom.telemetry import Recorder

    cfg = lm_config(corpus)
    splits = prepare_text(cfg.data)
    torch.manual_seed(0)
    model = GPT(256, 16, 2, 16, 2)
    rec = Recorder(
        TelemetryConfig(enabled=True, probe_size=5, families=("gradients",)),
        epochs=1,
        splits=splits,
        model=model,
        seed=0,
        loss=token_loss(),
        sequence=True,
    )
    ins = rec.instruments
    row = ins.observe()
    ref = model.double()
    x, y = splits.fit_x[:5], splits.fit_y[:5]
    loss = sum(token_cross_entropy(ref(x[i : i + 1]), y[i : i + 1]) for i in range(5)) / 5
    w = ref.blocks[1].branch.mlp.c_fc.weight
    (g,) = torch.autograd.grad(loss, w)
    got = row["grad/mean/weight_norm/blocks.1.branch.mlp.c_fc"]
    assert got == pytest.approx(float(g.norm()), rel=1e-5)


@pytest.mark.parametrize("family", ["probe", "scores"])
def test_a_family_that_reads_n_c_logits_is_refused_by_name(tmp_path, corpus, family):
    cfg = _telemetry(corpus, **{"telemetry.families": [family, "params"]})
    with pytest.raises(FathomError, match=rf"telemetry family '{family}' does not apply"):
        train(cfg, tmp_path / "t", telemetry=True)


def test_a_context_longer_than_a_split_is_refused(tmp_path, corpus):
    with pytest.raises(FathomError, match="longer than the val split"):
        train(lm_config(corpus, **{"data.context": 200}), tmp_path / "long")


def _write_toml(path: Path, corpus: Path, epochs: int) -> Path:
    path.write_text(f"""
name = "k"
study = "lm"
seed = 5
device = "cpu"
[data]
dataset = "text"
path = "{corpus}"
context = 16
[model]
kind = "gpt"
layers = 2
width = 16
heads = 2
layerdrop = 0.2
[optim]
name = "adamw"
lr = 3e-3
clip_norm = 1.0
batch_size = 4
epochs = {epochs}
schedule = {{ kind = "warmup_cosine", warmup_epochs = 1, final = 0.1 }}
[eval]
every = 1
batch_size = 32
[execution]
path = "eager"
precision = "fp32"
""")
    return path


def test_resume_after_sigkill_ends_on_the_uninterrupted_hash(tmp_path, corpus, forked):
    cfg_path = _write_toml(tmp_path / "lm.toml", corpus, epochs=10)
    assert main(["train", str(cfg_path), "--runs-dir", str(tmp_path / "ref"), "--quiet"]) == 0
    ref = RunDir(tmp_path / "ref" / "lm" / "k").manifest

    victim = forked(["train", str(cfg_path), "--runs-dir", str(tmp_path / "v"), "--quiet"])
    run_dir = tmp_path / "v" / "lm" / "k"
    hist = run_dir / "history.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:
        rows, _ = read_jsonl(hist) if hist.exists() else ([], [])
        if len(rows) >= 3:
            break
        assert victim.poll() is None, victim.output()
        time.sleep(0.02)
    time.sleep(random.uniform(0.0, 0.2))  # somewhere inside a later epoch
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    assert RunDir(run_dir).manifest["status"] == "running"
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    m = RunDir(run_dir).manifest
    assert m["status"] == "complete"
    for key in ("final_params", "training_order", "masks"):
        assert m["hashes"][key] == ref["hashes"][key]
    assert [r["epoch"] for r in RunDir(run_dir).history()] == list(range(11))


def test_tied_weights_survive_a_checkpoint_round_trip(tmp_path, corpus):
    res = train(lm_config(corpus, **{"optim.epochs": 1}), tmp_path / "w")
    model = RunDir(res.run_dir).load_model("final")
    assert model.lm_head.weight is model.wte.weight
    state = RunDir(res.run_dir).load_state("final")
    assert torch.equal(state["lm_head.weight"], state["wte.weight"])


def test_fields_added_for_language_models_leave_earlier_configs_hashing_as_before():
    """``data.context`` and ``optim.clip_norm`` are left out of a dump while unset, so a config
    recorded before they existed has the same ``config_hash`` (its run resumes); set, they
    are dumped and round-trip; ``with_updates`` reaches them."""
    from fathom.config import RunConfig

    dumped = RunConfig().model_dump(mode="json")
    assert "context" not in dumped["data"] and "clip_norm" not in dumped["optim"]
    assert set(dumped["data"]) | {"context"} == set(
        RunConfig.model_fields["data"].annotation.model_fields
    )
    updated = RunConfig().with_updates({"optim.clip_norm": 0.5})
    assert updated.model_dump()["optim"]["clip_norm"] == 0.5
    again = validate_run_config(updated.model_dump(mode="json"))
    assert again == updated


def test_a_language_model_is_judged_against_its_unigram_baseline():
    from fathom.study.records import language_model_warnings

    assert language_model_warnings(1.9, 3.18) == []
    (warning,) = language_model_warnings(3.2, 3.18)
    assert f"{math.exp(3.2):.2f}" in warning and f"{math.exp(3.18):.2f}" in warning
    assert "learned nothing of context" in warning
    assert language_model_warnings(None, 3.18)[0].startswith(
        "the run's validation perplexity unknown"
    )
