"""`fathom reproduce` end to end on CPU-sized synthetic data: every step, a rerun that skips
every verified step, a tampered output that reruns its step, and a SIGKILL mid-way whose
resumed pipeline ends with the same outputs as an uninterrupted one."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from fathom.errors import FathomError
from fathom.reproduce.config import load_pipeline
from fathom.reproduce.pipeline import Context, reproduce
from fathom.study.backends import LocalBackend
from test_audit_run import synthetic_splits as grid_splits

TESTS_DIR = Path(__file__).resolve().parent

STUDY_TOML = """
[study]
name = "tiny-seed"
reference = "residual"
recipes = ["residual", "sd_constant", "sd_decreasing"]
seeds = [101, 102]
scale_down = ["tiny synthetic test study"]
threads_per_run = 1

[tuning]
mode = "frozen"
lr = { residual = 0.05, sd_constant = 0.05, sd_decreasing = 0.04 }

[base]
device = "cpu"
[base.model]
widths = [32, 24, 16, 12, 8]
[base.optim]
epochs = 3
batch_size = 32
[base.eval]
every = 1
[base.checkpoints]
save_epochs = [0, 1, 3]
[base.telemetry]
enabled = true
first = [0]
every = 3
probe_size = 32
"""

PIPELINE_TOML = """
description = "tiny CPU pipeline for the tests"
study = "study.toml"
[audit]
router = false
settings = { margin_bins = 3, timing_batch_sizes = [8], timing_repeats = 1, n_permutations = 20 }
[curvature]
seed = 101
epochs = [0, 1, 3]
epoch_map = { "0" = 0, "1" = 1, "100" = 3 }
probe = 32
[head]
preset = "head.toml"
seed = 104
epochs = 2
[report]
figures = false
"""

HEAD_TOML = """
name = "head"
device = "cpu"
[model]
recipe = "plain"
widths = [32, 24, 16, 12, 8]
input_scale = 1.0
output_relu = true
[optim]
lr = 0.001
batch_size = 32
epochs = 2
[eval]
every = 1
"""


def splits_for(cfg, device):
    """The grid-block synthetic digits (learnable in a few epochs), whatever the config."""
    return grid_splits()


def write_pipeline(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "study.toml").write_text(STUDY_TOML)
    (d / "head.toml").write_text(HEAD_TOML)
    (d / "pipe.toml").write_text(PIPELINE_TOML.replace('"head.toml"', repr(str(d / "head.toml"))))
    return d / "pipe.toml"


def context(pipe_path: Path, runs: Path, log: list[str]) -> Context:
    name, pipe, study, _ = load_pipeline(str(pipe_path))
    return Context(
        name,
        pipe,
        study,
        runs,
        LocalBackend(1, 1, splits_for),
        say=log.append,
        splits_for=splits_for,
    )


def final_outputs(runs: Path) -> dict:
    """Everything that must not depend on being interrupted (clocks and timings left out)."""
    root = runs / "tiny-seed"
    summary = json.loads((root / "summary.json").read_text())
    audit = json.loads((root / "audit" / "audit.json").read_text())
    curv = {}
    for p in sorted(root.glob("main-*-s101/curvature/summary.json")):
        rows = json.loads(p.read_text())["rows"]
        curv[p.parent.parent.name] = [
            {k: v for k, v in r.items() if k != "runtime_s"} for r in rows
        ]
    head = json.loads((runs / "tiny-seed-head" / "head.json").read_text())
    repro = json.loads((root / "reproduce" / "reproduction.json").read_text())
    return {
        "final_params": {k: v["final_params"] for k, v in summary["runs"].items()},
        "audit": {
            r["run_id"]: {
                w: (c["by_size"], c["branches"], c["interactions"])
                for w, c in r["checkpoints"].items()
            }
            for r in audit["runs"]
        },
        "curvature": curv,
        "head": {
            h: (a["params_sha256"], a["per_class"], a["accuracy"]) for h, a in head["heads"].items()
        },
        "reproduction": [
            (r["id"], r["fathom_per_seed"], r["verdict"])
            for r in repro["rows"]
            if not r["id"].startswith(("timing.", "telemetry."))
        ],
    }


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    d = tmp_path_factory.mktemp("straight")
    log: list[str] = []
    ctx = context(write_pipeline(d), d / "runs", log)
    reproduce(ctx)
    return d, ctx, log


def test_pipeline_writes_every_step_and_the_comparison(straight):
    d, ctx, _ = straight
    assert ctx.actions == dict.fromkeys(
        [
            "study",
            "audit",
            "curvature:main-residual-s101",
            "curvature:main-sd_constant-s101",
            "curvature:main-sd_decreasing-s101",
            "head",
            "compare",
            "report",
        ],
        "ran",
    )
    root = d / "runs" / "tiny-seed"
    summary = json.loads((root / "summary.json").read_text())
    assert summary["tuning"]["mode"] == "frozen" and not list(root.glob("tune-*"))
    for recipe in ("residual", "sd_constant", "sd_decreasing"):
        rows = json.loads((root / f"main-{recipe}-s101" / "curvature" / "summary.json").read_text())
        assert [r["epoch"] for r in rows["rows"]] == [0, 1, 3]
    repro = json.loads((root / "reproduce" / "reproduction.json").read_text())
    assert repro["kind"] == "fathom.reproduce.comparison" and not repro["comparable_in_magnitude"]
    rows = {r["id"]: r for r in repro["rows"]}
    # the seed's number beside Fathom's, read back from the run directories
    q = rows["quality.residual.selected_acc"]
    per_seed = {}
    for s in (101, 102):
        run = root / f"main-residual-s{s}"
        epoch = json.loads((run / "manifest.json").read_text())["selected"]["epoch"]
        rows_ = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
        per_seed[s] = 100 * next(r["test/acc"] for r in rows_ if r["epoch"] == epoch)
    assert q["fathom_per_seed"] == pytest.approx({str(k): v for k, v in per_seed.items()})
    assert q["difference"] == pytest.approx(sum(per_seed.values()) / 2 - 98.373)
    assert q["verdict"].startswith("not comparable in magnitude")
    ggn = rows["curvature.residual.epoch100.ggn_trace"]
    curv = json.loads((root / "main-residual-s101" / "curvature" / "epoch-0003.json").read_text())
    assert ggn["fathom"]["mean"] == pytest.approx(curv["totals"]["ggn_weight_trace"])
    # a seed epoch the pipeline maps to no snapshot says so instead of inventing a value
    assert "no counterpart snapshot" in rows["curvature.residual.epoch5.ggn_trace"]["verdict"]
    assert rows["head.relu.sixes_correct"]["fathom"]["n"] == 1
    zero = rows["telemetry.sd_decreasing.zero_activations.max"]["fathom_per_seed"]
    names = [f"blocks.{i}.res.branch" for i in range(4)] + ["head"]
    per_layer = _last_rows(root, "sd_decreasing", "probe/act/zero_frac", names)
    top = max(names, key=lambda n: sum(per_layer[n].values()))  # largest seed mean
    assert zero == pytest.approx({str(s): 100 * v for s, v in per_layer[top].items()})
    assert rows["fidelity.plain.final_acc"]["verdict"].startswith("no Fathom counterpart here")
    md = (root / "reproduce" / "reproduction.md").read_text()
    assert "not comparable in magnitude" in md and "never digit for digit" in md
    # true epochs on both sides: the seed's epoch 100 is this 3-epoch study's epoch 3
    final = next(x for x in md.splitlines() if x.startswith("| residual dense: epoch-100 test acc"))
    assert "| 100 → 3 |" in final
    overhead = next(x for x in md.splitlines() if x.startswith("| largest telemetry overhead"))
    assert "| 100 → 3 |" in overhead  # a whole-run quantity: the runs' lengths
    digits = next(x for x in md.splitlines() if x.startswith("## Epoch-100 per-digit"))
    assert digits.endswith("— seed epoch 100 → Fathom epoch 3 (final checkpoint)")  # whole table
    sel = next(x for x in md.splitlines() if x.startswith("| residual dense: validation-selected"))
    epochs = sorted(
        {
            json.loads((root / f"main-residual-s{s}" / "manifest.json").read_text())["selected"][
                "epoch"
            ]
            for s in (101, 102)
        }
    )
    assert f"| selected → selected (epoch{'s' if len(epochs) > 1 else ''} " in sel
    assert ", ".join(map(str, epochs)) + ") |" in sel
    assert (root / "report" / "report.html").exists()


def _last_rows(root: Path, recipe: str, base: str, layers: list[str]) -> dict[str, dict]:
    """``{layer: {seed: value}}`` of ``base/<layer>`` in each run's last row holding it, read
    straight from history.jsonl (the brute-force reference of the telemetry counterparts)."""
    out: dict[str, dict] = {n: {} for n in layers}
    for s in (101, 102):
        lines = (root / f"main-{recipe}-s{s}" / "history.jsonl").read_text().splitlines()
        row = [r for r in map(json.loads, lines) if f"{base}/{layers[0]}" in r][-1]
        assert row["epoch"] == 3
        for n in layers:
            out[n][s] = row[f"{base}/{n}"]
    return out


def test_every_seed_002_telemetry_table_has_a_counterpart(straight):
    from fathom.report.crossrun import default_reference, study_alignment
    from fathom.report.runs import load_runs
    from fathom.report.telemetry_tables import activation_table, gradient_table

    root = straight[0] / "runs" / "tiny-seed"
    repro = json.loads((root / "reproduce" / "reproduction.json").read_text())
    tables = {t["id"]: t for t in repro["tables"]}
    wanted = ["overhead", "gradients", "activations", "digits", "concentration"]
    assert {f"telemetry_{w}" for w in wanted} <= set(tables)
    rows = [r for r in repro["rows"] if r["table"].startswith("telemetry_")]
    assert len(rows) == 14 and all(r["fathom"] is not None for r in rows), [
        r["id"] for r in rows if r["fathom"] is None
    ]
    for r in rows:
        f = r["fathom"]
        assert r["difference"] == pytest.approx(f["mean"] - r["seed_value"])
        if f["n"] > 1:
            assert r["within_spread"] == (f["min"] <= r["seed_value"] <= f["max"])
    by_id = {r["id"]: r for r in rows}
    layers = ["stem", *(f"blocks.{i}.res.branch" for i in range(4)), "head"]
    for recipe in ("residual", "sd_constant", "sd_decreasing"):
        per_layer = _last_rows(root, recipe, "grad/pex/participation", layers)
        low = min(layers, key=lambda n: sum(per_layer[n].values()))
        got = by_id[f"telemetry.{recipe}.participation.min"]["fathom_per_seed"]
        assert got == pytest.approx({str(s): v for s, v in per_layer[low].items()})
    noise = _last_rows(root, "sd_constant", "grad/pex/noise_scale", ["head"])["head"]
    got = by_id["telemetry.sd_constant.noise_scale.head"]["fathom_per_seed"]
    assert got == pytest.approx({str(s): v for s, v in noise.items()})
    io = [
        json.loads((root / f"main-{r}-s101" / "manifest.json").read_text())["clocks"][
            "checkpoint_s"
        ]
        for r in ("residual", "sd_constant", "sd_decreasing")
    ]
    assert by_id["telemetry.checkpoint_io.max"]["fathom"]["mean"] == pytest.approx(max(io))
    assert by_id["telemetry.checkpoint_io.min"]["verdict"].startswith("not comparable")
    # the cells are the report's cross-run cells
    runs = load_runs(root)
    ref = default_reference(runs, None)
    align = study_alignment(runs, ref)
    act = next(r for r in activation_table(runs, ref, align).rows if r["recipe"] == "sd_decreasing")
    cells = [v for k, v in act.items() if k.startswith("layer:")]
    top = by_id["telemetry.sd_decreasing.zero_activations.max"]["fathom"]
    assert max(c["mean"] for c in cells) == pytest.approx(top["mean"])
    head = next(
        r
        for r in gradient_table(runs, ref, align).rows
        if r["recipe"] == "residual" and r["epoch"] == 3
    )
    part = _last_rows(root, "residual", "grad/pex/participation", ["head"])["head"]
    assert head["participation"]["mean"] == pytest.approx(sum(part.values()) / 2)
    # tables whose numbers the seed does not give: Fathom's cross-run table printed whole
    assert tables["telemetry_gradients"]["fathom_table"]["name"] == "gradients"
    assert tables["telemetry_digits"]["fathom_table"]["name"] == "digits_test"
    md = (root / "reproduce" / "reproduction.md").read_text()
    assert "### Fixed-probe gradients of the head layer (head)" in md
    assert "### Per-digit test accuracy difference from residual" in md


def test_rerun_skips_every_verified_step_and_a_tampered_output_reruns(straight):
    d = straight[0]
    log: list[str] = []
    again = context(d / "pipe.toml", d / "runs", log)
    reproduce(again)
    assert set(again.actions.values()) == {"skipped"}
    n = len(again.plan)  # study, audit, a curvature step per recipe, head, compare, report
    assert list(again.plan)[:2] == ["study", "audit"] and n == 5 + len(again.pipe.curvature.recipes)
    assert any(line.startswith(f"[1/{n} study] skipped: complete and verified") for line in log)
    audit_md = d / "runs" / "tiny-seed" / "audit" / "audit.md"
    audit_md.write_text(audit_md.read_text() + "\nedited by hand\n")
    log.clear()
    third = context(d / "pipe.toml", d / "runs", log)
    reproduce(third)
    assert third.actions["study"] == "skipped" and third.actions["audit"] == "ran"
    assert any(
        line.startswith(f"[2/{n} audit] running: remove trained branches")
        and "(output tiny-seed/audit/audit.md was modified; pipeline elapsed" in line
        for line in log
    )
    # the pipeline's ETA: every step has a recorded time from the first run, so no lower bound
    running = next(line for line in log if line.startswith(f"[2/{n} audit] running"))
    assert re.search(r"pipeline elapsed \d+:\d\d, ETA \d+:\d\d\)$", running), running
    done = next(line for line in log if line.startswith(f"[2/{n} audit] done in"))
    assert re.search(r"s \(pipeline elapsed \d+:\d\d, ETA \d+:\d\d\)$", done), done
    assert third.actions["curvature:main-residual-s101"] == "skipped"


def test_bad_pipeline_input_names_the_fix(tmp_path):
    path = write_pipeline(tmp_path)
    text = path.read_text().replace("epochs = [0, 1, 3]", "epochs = [0, 2]")
    (tmp_path / "bad.toml").write_text(text.replace('"1" = 1, "100" = 3', '"100" = 2'))
    with pytest.raises(FathomError, match=r"curvature epochs \[2\] are not saved by the study"):
        load_pipeline(str(tmp_path / "bad.toml"))
    with pytest.raises(
        FathomError, match="valid presets: quick, seed-000, seed-000-tiny, seed-003"
    ):
        load_pipeline("seed-004")
    (tmp_path / "typo.toml").write_text(text.replace("[curvature]", "[curvture]"))
    with pytest.raises(FathomError, match="unknown key 'curvture'"):
        load_pipeline(str(tmp_path / "typo.toml"))


def test_shipped_pipelines_match_their_studies():
    for name in ("quick", "seed-003"):
        _, pipe, study, _ = load_pipeline(name)
        assert pipe.curvature.recipes == ("residual", "sd_constant", "sd_decreasing")
        assert pipe.curvature.seed == 101 and pipe.head.seed == 104
        assert study.lr_source() == "frozen"
    _, full, study, _ = load_pipeline("seed-003")
    assert full.curvature.epochs == (0, 1, 5, 10, 20, 50, 100) and full.head.epochs == 5
    assert len(study.study.recipes) * len(study.study.seeds) == 15
    assert len(full.curvature.epochs) * len(full.curvature.recipes) == 21


def _recorded_steps(runs: Path) -> set[str]:
    try:
        return set(
            json.loads((runs / "tiny-seed" / "reproduce" / "pipeline.json").read_text())["steps"]
        )
    except (FileNotFoundError, json.JSONDecodeError):
        return set()


def test_killed_pipeline_resumes_to_the_uninterrupted_outputs(straight, tmp_path, forked):
    pipe = write_pipeline(tmp_path)
    runs = tmp_path / "runs"
    # the pipeline killed is a real process, forked from this one (:mod:`forked`)
    proc = forked(lambda: reproduce(context(pipe, runs, [])), new_session=True)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            done = _recorded_steps(runs)
            if "study" in done:  # killed inside the audit, after the study step completed
                break
            assert proc.poll() is None, "the pipeline ended before it could be killed"
            time.sleep(0.01)
        else:
            pytest.fail("the study step did not complete in time")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert "audit" not in _recorded_steps(runs) and "report" not in _recorded_steps(runs)
    log: list[str] = []
    resumed = context(pipe, runs, log)
    reproduce(resumed)
    assert resumed.actions["study"] == "skipped" and resumed.actions["audit"] == "ran"
    assert resumed.actions["report"] == "ran"
    assert final_outputs(runs) == final_outputs(straight[0] / "runs")
    # the killed pipeline's lock was stale: taken over, said and recorded
    events = json.loads((runs / "tiny-seed" / "reproduce" / "pipeline.json").read_text())["events"]
    assert [(e["event"], e["pid"]) for e in events] == [("stale_lock_taken_over", proc.pid)]
    assert any(f"PID {proc.pid}" in line for line in log)


def test_second_pipeline_on_the_same_directory_is_refused_naming_the_holder(
    tmp_path, capsys, forked
):
    from fathom.cli import main
    from fathom.reproduce.state import pipeline_lock
    from test_rundir import wait_for_line

    pipe, runs = write_pipeline(tmp_path), tmp_path / "runs"

    def hold() -> None:  # another process (forked from this one) holding the pipeline lock
        lock = pipeline_lock(runs / "tiny-seed").acquire()
        print("locked", flush=True)
        time.sleep(60)
        del lock

    holder = forked(hold)
    try:
        wait_for_line(holder, "locked")
        rc = main(["reproduce", str(pipe), "--runs-dir", str(runs), "--quiet"])
        err = capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert rc == 2
    assert f"PID {holder.pid}" in err and "reproduction output directory" in err
    assert not (runs / "tiny-seed" / "summary.json").exists()  # nothing ran beside the holder
