"""The depth-scaling benchmark on a language model: GPT depths, dense vs LayerDrop, judged
in nats per token by the level-and-trend rule. End to end on a synthetic corpus, and the
verdict on generated tables (a level difference alone never says "scales better")."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fathom.cli import main
from fathom.depthscale.lm import make_lm_config, plan_lm_runs
from fathom.depthscale.lm_runner import run_lm_benchmark
from fathom.depthscale.lm_verdict import LMRunRecord, lm_depth_verdict, write_lm_table
from fathom.errors import FathomError
from fathom.rundir import RunDir

TEXT = "A whale ship was my Yale College and my Harvard. Call me Ishmael.\n" * 30
UNIGRAM = 3.0


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
    again = run_lm_benchmark(cfg, tmp_path / "bench")  # complete runs are skipped
    assert RunDir(again / "d01-dense-s0").manifest == RunDir(root / "d01-dense-s0").manifest


def _records(table: dict[tuple[int, str, int], float], failed=()) -> list[LMRunRecord]:
    return [
        LMRunRecord(d, arm, s, "diverged" if (d, arm, s) in failed else "complete", ce, UNIGRAM)
        for (d, arm, s), ce in table.items()
    ]


@settings(max_examples=40, deadline=None)
@given(
    st.floats(-0.5, 0.5),
    st.lists(st.floats(-0.05, 0.05), min_size=3, max_size=3),
    st.lists(st.floats(2.0, 2.5), min_size=4, max_size=4),
)
def test_a_constant_advantage_never_scales_better_or_worse(offset, seed_noise, base):
    """LayerDrop = dense + a constant (per seed): the level may differ, the trend cannot."""
    depths = (2, 4, 6, 8)
    table = {}
    for i, d in enumerate(depths):
        for s, n in enumerate(seed_noise):
            table[(d, "dense", s)] = base[i] + 0.01 * s
            table[(d, "LayerDrop", s)] = base[i] + 0.01 * s + offset + n
    v = lm_depth_verdict(_records(table))
    assert v.trend not in ("scales better", "scales worse")


def test_a_growing_advantage_scales_better_and_a_level_alone_does_not():
    depths, seeds = (2, 4, 6, 8), (0, 1, 2, 3)
    grow = {}
    level = {}
    for d in depths:
        for s in seeds:
            jitter = 0.001 * ((s * 7 + d) % 3)
            grow[(d, "dense", s)] = 2.0
            grow[(d, "LayerDrop", s)] = 2.0 - 0.05 * d + jitter
            level[(d, "dense", s)] = 2.0
            level[(d, "LayerDrop", s)] = 1.8 + jitter
    g = lm_depth_verdict(_records(grow))
    assert g.trend == "scales better" and g.level == "better across depths"
    flat = lm_depth_verdict(_records(level))
    assert flat.level == "better across depths" and flat.trend == "scales equivalently"
    assert any(line.startswith("scaling") for line in flat.lines)


def test_failures_enter_at_the_unigram_baseline_and_an_arm_that_always_fails_concludes_nothing():
    depths, seeds = (2, 4), (0, 1)
    table = {(d, a, s): 2.0 for d in depths for a in ("dense", "LayerDrop") for s in seeds}
    allfail = {(d, "LayerDrop", s) for d in depths for s in seeds}
    v = lm_depth_verdict(_records(table, failed=allfail))
    assert v.level == v.trend == "no conclusion"
    worse = {**table, (2, "LayerDrop", 0): UNIGRAM + 1}  # no better than the baseline: failed
    rec = _records(worse)
    assert next(r for r in rec if r.ce == UNIGRAM + 1).failed
    missing = lm_depth_verdict(_records({k: v for k, v in table.items() if k != (4, "dense", 1)}))
    assert missing.level == "no comparison" and "dense at depth 4" in missing.lines[0]


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
