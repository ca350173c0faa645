"""The depth-scaling benchmark on a language model: GPT depths, dense vs LayerDrop, judged
in nats per token by the level-and-trend rule, end to end on a synthetic corpus: the written
table's verdict is re-derived by the claim checker from the recorded runs, and a record
changed after the fact is caught (the rule itself: ``tests/test_stats_lm_scaling.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fathom.cli import main
from fathom.depthscale.lm import make_lm_config, plan_lm_runs
from fathom.depthscale.lm_verdict import write_lm_table
from fathom.depthscale.runner import run_lm_benchmark
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.stats.claims import check
from fathom.stats.results import Results

TEXT = "A whale ship was my Yale College and my Harvard. Call me Ishmael.\n" * 30


def tiny(corpus: Path, **kw):
    values = dict(
        dataset="text",
        path=str(corpus),
        context=8,
        depths=[1, 2],
        width=16,
        heads=2,
        epochs=5,
        lr=2e-2,
        batch_size=16,
        seeds=[0, 1],
        device="cpu",
        eval_batch_size=64,
    )
    return make_lm_config(**{**values, **kw})


def test_the_benchmark_runs_end_to_end_on_a_synthetic_corpus(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    cfg = tiny(corpus)
    root = run_lm_benchmark(cfg, tmp_path / "bench")
    names = sorted(p.name for p in root.iterdir() if (p / "manifest.json").exists())
    assert names == [
        f"d0{d}-{a}-s{s}" for d in (1, 2) for a in ("dense", "layerdrop") for s in (0, 1)
    ]
    drop = RunDir(root / "d02-layerdrop-s0").config.model
    assert drop.layerdrop == 0.2 and RunDir(root / "d02-dense-s0").config.model.layerdrop == 0
    verdict = write_lm_table(root, "Setup: test.")
    table = json.loads((root / "table.json").read_text())
    assert len(table["runs"]) == 8
    for run in table["runs"]:
        assert run["ppl"] == pytest.approx(math.exp(run["ce"]))
        hist = RunDir(run["run_dir"]).history()
        sel = next(r for r in hist if r["epoch"] == run["selected_epoch"])
        assert run["ce"] == sel["test/ce"]
    allowed = {"better across depths", "worse across depths", "equivalent across depths",
               "inconclusive", "not established", "no conclusion", "no comparison"}  # fmt: skip
    assert verdict.level in allowed
    assert not any(r["failed"] for r in table["runs"])  # every run beat the unigram baseline
    assert verdict.level not in ("no conclusion", "no comparison")
    md = (root / "table.md").read_text()
    assert "**Level:**" in md and "**Scaling:**" in md and "Setup: test." in md
    results = Results.model_validate(table["verdict"]["results"])
    assert check(results) == []
    assert {d.id for d in results.decisions} == {"level", "trend"}
    assert [r["ce"] for r in results.decisions[0].records["runs"]] == [
        r["ce"] for r in table["runs"]
    ]
    again = run_lm_benchmark(cfg, tmp_path / "bench")  # complete runs are skipped
    assert RunDir(again / "d01-dense-s0").manifest == RunDir(root / "d01-dense-s0").manifest


def test_bad_settings_are_refused_naming_the_fix(tmp_path):
    with pytest.raises(FathomError, match="LayerDrop arm's probability"):
        make_lm_config("gpt-quick", layerdrop=0.0)
    with pytest.raises(FathomError, match="did you mean 'gpt-quick'"):
        make_lm_config("gpt-quik")
    assert main(["depth-scaling", "--preset", "gpt-quick", "--timesteps", "2"]) == 2
    assert main(["depth-scaling", "--preset", "gpt-qick"]) == 2


def test_presets_plan_both_arms_at_every_depth():
    cfg = make_lm_config("gpt-quick")
    runs = plan_lm_runs(cfg, "s")
    assert len(runs) == len(cfg.depths) * 2 * len(cfg.seeds)
    assert {r.model.layers for r in runs} == set(cfg.depths)
    assert {r.model.layerdrop for r in runs} == {0.0, cfg.layerdrop}
    gpu = make_lm_config("gpt-gpu")
    assert max(gpu.depths) == 12 and gpu.device == "auto"
