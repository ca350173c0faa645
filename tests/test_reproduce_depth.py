"""`fathom reproduce` of seed 000's depth-scaling table, end to end at CPU scale: a tiny
synthetic archive in the official CIFAR-100 format read by the real reader, a scaled-down
copy of the seed-000 preset, the table printed beside the log's (per depth and arm: seed,
Fathom, difference, in-range flag), the verdicts, a rerun that skips, and the full preset."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
from pathlib import Path

import pytest

from fathom.cli import main
from fathom.data import DATASETS
from fathom.depthscale.config import SEED_000, plan_runs, protocol_reductions
from fathom.models import count_parameters
from fathom.reproduce.config import load_pipeline
from fathom.reproduce.depth_compare import SEED_CLAIM, seed_log_table
from fathom.reproduce.seeds import load_seeds
from fathom.stats.scaling import depth_scaling_verdict
from test_data_cifar import checksummed, write_archive

PIPE = """
description = "seed-000-tiny at two depths (tests)"
depth_scaling = { config = "cifar100-seed-000-tiny", overrides = { depths = [4, 20], fit_subset = 32, eval_subset = 16, val_size = 16, lyap_subbatch = 1, probe_size = 1, timesteps = 1 } }
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The pipeline once, on a 100 + 100 image CIFAR-100-format archive (its own checksums)."""
    d = tmp_path_factory.mktemp("seed000")
    mp = pytest.MonkeyPatch()
    mp.setenv("FATHOM_CACHE", str(d / "cache"))
    spec = DATASETS["cifar100"]
    write_archive(d / spec.archive, spec, per_batch=100)
    mp.setitem(DATASETS, "cifar100", checksummed(spec, d / spec.archive, per_batch=100))
    (d / "pipe.toml").write_text(PIPE)
    argv = ["reproduce", str(d / "pipe.toml"), "--runs-dir", str(d / "runs"), "--data-dir", str(d)]
    yield d, argv, mp
    mp.undo()


@pytest.fixture(scope="module")
def first(tiny):
    _, argv, _ = tiny
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _brute_force(root: Path) -> dict[tuple[int, str, int], float]:
    """Test accuracy at the selected epoch, read straight from each run's files."""
    out = {}
    for run in sorted(p for p in root.iterdir() if (p / "manifest.json").exists()):
        m = json.loads((run / "manifest.json").read_text())
        rows = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
        row = next(r for r in rows if r["epoch"] == m["selected"]["epoch"])
        tags = m["config"]["tags"]
        out[(tags["depth"], tags["arm"], m["config"]["seed"])] = row["test/acc"]
    return out


def test_side_by_side_table_prints_and_is_computed_from_the_runs(tiny, first):
    d, _, _ = tiny
    rc, out, err = first
    assert rc == 0, err
    assert "Seed 000's cifar100 depth-scaling table beside Fathom's" in out
    lines = [x.split() for x in out.splitlines()]
    for start in (
        ["4", "vanilla", "acc", "(%)", "61.40%"],
        ["8", "vanilla", "acc", "(%)", "52.20%", "—", "—", "—", "none"],  # not run here
        ["4", "vanilla", "κ", "1.2e+09"],
    ):
        assert any(x[: len(start)] == start for x in lines), start
    # the seed's own λ̂ is quoted as logged (7 significant digits: 2.71x), not rounded
    assert any(x[:3] == ["20", "Lyapunov", "λ̂"] and x[3].startswith("2.71") for x in lines)
    assert (
        max(len(x) for x in out.splitlines() if not x.startswith(("reproduction:", "Fathom's t")))
        <= 80
    )
    root = d / "runs" / "pipe"
    result = json.loads((root / "reproduce" / "reproduction.json").read_text())
    rows = {r["id"]: r for r in result["rows"]}
    assert len(rows) == 37
    acc = _brute_force(root)
    for depth in (4, 20):
        for arm, key in (("vanilla", "vanilla"), ("Lyapunov", "lyapunov")):
            r = rows[f"depth.d{depth}.{key}.test_acc"]
            xs = [acc[(depth, arm, s)] for s in (0, 1)]
            assert r["fathom"]["mean"] == pytest.approx(statistics.fmean(xs), abs=1e-12)
            assert r["fathom"]["n"] == 2
            assert r["difference"] == pytest.approx(statistics.fmean(xs) - r["seed_value"])
            assert r["within_spread"] == (min(xs) <= r["seed_value"] <= max(xs))
        delta = rows[f"depth.d{depth}.delta_acc"]["fathom_per_seed"]
        for s in (0, 1):
            want = acc[(depth, "Lyapunov", s)] - acc[(depth, "vanilla", s)]
            assert delta[str(s)] == pytest.approx(want, abs=1e-12)
    change = rows["depth.vanilla.change_4_to_20"]["fathom_per_seed"]
    assert change["0"] == pytest.approx(acc[(20, "vanilla", 0)] - acc[(4, "vanilla", 0)])
    assert rows["depth.d8.vanilla.test_acc"]["fathom"] is None
    assert "no Fathom counterpart" in rows["depth.d8.vanilla.test_acc"]["verdict"]
    assert rows["depth.d4.vanilla.kappa"]["verdict"].startswith(
        "not comparable (another definition): the log"
    )
    assert rows["depth.d4.lyapunov.lambda"]["verdict"].startswith(
        "not comparable (another definition): the log gives its λ at epoch 150"
    )
    assert result["comparable_in_magnitude"] is False and "epochs 1 (protocol: 150)" in " ".join(
        result["scale_down"]
    )


def test_verdicts_beside_the_log_never_reach_its_false_conclusion(tiny, first):
    d, _, _ = tiny
    _, out, _ = first
    result = json.loads((d / "runs" / "pipe" / "reproduce" / "reproduction.json").read_text())
    v = result["verdicts"]["depth_scaling"]
    assert v["seed_conclusion"] == "✓ Lyapunov regularization enables better depth scaling!"
    assert v["rule_on_seed_log"]["trend"] == v["rule_on_seed_log"]["level"] == "no conclusion"
    assert v["rule_on_seed_log"]["sentence"].startswith("no conclusion: the Lyapunov arm")
    assert SEED_CLAIM == "scales better"  # the log's claim is about the change with depth
    assert v["fathom"]["reaches_seed_claim"] == (v["fathom"]["trend"] == SEED_CLAIM)
    assert {"level", "trend"} <= set(v["fathom"]) and {"level", "trend"} <= set(
        v["rule_on_seed_log"]
    )
    assert "Fathom's rule on the seed log's own numbers: no conclusion" in " ".join(out.split())
    md = (d / "runs" / "pipe" / "reproduce" / "reproduction.md").read_text()
    assert "| 4 | vanilla | acc (%) | 61.40% |" in md and "## Verdicts" in md
    table = json.loads((d / "runs" / "pipe" / "table.json").read_text())
    assert set(result["per_depth"]) == {"4", "20"}
    for depth in ("4", "20"):  # each depth's cells and verdict, as Fathom's table has them
        cells = table["rows"][["4", "20"].index(depth)]["cells"]
        word = table["verdict"]["per_depth"][depth]["verdict"]
        line = f"depth {depth}: vanilla {cells['vanilla']}, Lyapunov {cells['Lyapunov']}; "
        assert line + f"Lyapunov vs vanilla: {word}" in " ".join(out.split()) and line in md


def test_rerun_skips_both_verified_steps(tiny, first):
    _, argv, _ = tiny
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(argv) == 0
    assert "[1/2 depth-scaling] skipped: complete and verified" in err.getvalue()
    assert "[2/2 compare] skipped: complete and verified" in err.getvalue()


def test_fathom_rule_on_the_logs_table_is_no_conclusion():
    verdict = depth_scaling_verdict(seed_log_table(load_seeds()))
    assert verdict.verdict == verdict.level == verdict.trend == "no conclusion"
    assert "Lyapunov arm failed to train at every depth" in verdict.sentence


def test_full_preset_is_the_logs_protocol():
    name, pipe, cfg, _ = load_pipeline("seed-000")
    assert name == "seed-000" and pipe.depth_scaling is not None
    assert cfg.dataset == "cifar100" and cfg.depths == [4, 8, 12, 16, 20]
    assert (cfg.timesteps, cfg.epochs, cfg.neuron, cfg.width_mult) == (4, 150, "lif", 1.0)
    assert (cfg.lyap_weight, cfg.lyap_target) == (0.3, -0.1)
    assert protocol_reductions(cfg) == []
    runs = plan_runs(cfg, "s")
    assert len(runs) == 10 and {r.regularizer.weight for r in runs} == {0.0, 0.3}
    from fathom.train.build import init_model

    logged = {4: 1_756_836, 20: 14_298_276}  # the log's "params=" lines
    for r in runs:
        if r.tags["depth"] in logged and r.tags["arm"] == "vanilla":
            model = init_model(r, classes=100, input_shape=(3, 32, 32))
            assert count_parameters(model) == logged[r.tags["depth"]]
    _, _, tiny_cfg, _ = load_pipeline("seed-000-tiny")
    assert set(protocol_reductions(tiny_cfg)) and tiny_cfg.depths == SEED_000["depths"]


def test_bad_depth_pipelines_are_refused(tmp_path):
    from fathom.errors import FathomError

    bad = {
        'study = "x"\ndepth_scaling = { config = "quick" }\n': "exactly one of study",
        'depth_scaling = { config = "quick" }\n[audit]\nrouter = false\n': "not of a depth-scaling",
        'depth_scaling = { config = "quick", overrides = { epochs = 0 } }\n': "epochs",
        'depth_scaling = { config = "nope.toml" }\n': "nope.toml",
    }
    for i, (text, message) in enumerate(bad.items()):
        (tmp_path / f"p{i}.toml").write_text(text)
        with pytest.raises(FathomError, match=message):
            load_pipeline(str(tmp_path / f"p{i}.toml"))


def test_gpu_script_parses_and_plans_seed_000(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "bench" / "gpu_reproduce.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "DRY": "1",
        "PRESET": "seed-000",
        "EPOCHS": "3",
        "OUT": str(tmp_path / "out"),
        "RUNS": str(tmp_path / "runs"),
        "CIFAR_DIR": str(tmp_path / "nowhere"),
    }
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "depths [4, 8, 12, 16, 20] T 4 epochs 3 seeds [0] runs 10" in done.stdout
    assert "scaled down: epochs 3 (protocol: 150)" in done.stdout
    assert "cifar-100-python.tar.gz not under CIFAR_DIR" in done.stdout
    written = (tmp_path / "out" / "reproduce" / "seed-000.toml").read_text()
    assert 'config = "cifar100-seed-000"' in written and "epochs = 3" in written
