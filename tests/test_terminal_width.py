"""Terminal output fits 80 columns and never cuts run ids, hashes, statuses or verdicts."""

from __future__ import annotations

import argparse
import hashlib
import json
import math

from rich.console import Console

from fathom.data.cli import files_table, info, info_table
from fathom.data.registry import DATASETS
from fathom.depthscale.table import RunRecord as DepthRecord
from fathom.depthscale.table import build_table, print_results
from fathom.stats.summary import RunRecord, summarise_study
from fathom.study.cli import progress_line, status_counts, status_table
from fathom.study.execute import RunOutcome
from fathom.study.report import print_summary
from fathom.study.runs_cli import runs_tables

RECIPES = ("plain", "residual", "residual_dropout", "sd_constant", "sd_decreasing")


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def render(*items, width: int = 80, call=None) -> str:
    console = Console(width=width, record=True, color_system=None)
    if call is not None:
        call(console)
    for item in items:
        console.print(item)
    return console.export_text()


def assert_fits(text: str, intact: list[str], width: int = 80) -> None:
    lines = text.splitlines()
    too_long = [line for line in lines if len(line.rstrip()) > width]
    assert not too_long, too_long
    assert "…" not in text
    missing = [word for word in intact if not any(word in line for line in lines)]
    assert not missing, missing


def _registry_rows() -> list[dict]:
    rows = []
    for recipe in RECIPES:
        for lr in (0.001, 0.03, 0.1):
            rid = f"tune-{recipe}-lr{lr:g}-s1001"
            rows.append(
                _reg(rid, "tuning", recipe, 1001, lr, "diverged" if lr == 0.1 else "complete")
            )
        rows.append(_reg(f"main-{recipe}-s101", "main", recipe, 101, 0.03, "complete"))
    rows[-1]["status"] = "failed"
    return rows


def _reg(rid, phase, recipe, seed, lr, status):
    done = status == "complete"
    return {
        "study": "ciresan-sd-quick",
        "run_id": rid,
        "phase": phase,
        "recipe": recipe,
        "seed": seed,
        "lr": lr,
        "status": status,
        "selected_test_acc": 0.98123 if done else None,
        "final_test_acc": 0.98234 if done else None,
        "final_test_ce": 0.061234 if done else None,
        "final_params": _hash(rid) if done else None,
    }


def test_runs_list_fits_and_wide_shows_full_hashes():
    rows = _registry_rows()
    text = render(*runs_tables(rows))
    assert_fits(text, [r["run_id"] for r in rows] + ["diverged", "failed", "98.12"])
    assert all(_hash(r["run_id"])[:12] in text for r in rows if r["final_params"])
    assert _hash(rows[1]["run_id"]) not in text
    wide = render(*runs_tables(rows, wide=True), width=250)
    assert _hash(rows[1]["run_id"]) in wide and "residual_dropout" in wide


def test_study_status_counts_each_state_separately_and_fits():
    statuses = ["complete", "diverged", "failed", "running", "interrupted", "not started"]
    rows = [
        {
            "run_id": f"tune-residual_dropout-lr0.001-s{i}",
            "phase": "tuning",
            "recipe": "residual_dropout",
            "seed": i,
            "lr": 0.001,
            "status": st,
            "epochs": "100/100",
            "final_params": _hash(st) if st == "complete" else None,
        }
        for i, st in enumerate(statuses)
    ]
    rows.append({**rows[0], "run_id": "main-sd_decreasing-s103", "status": "waiting for tuning"})
    assert status_counts(rows) == (
        "1 complete, 1 diverged, 1 failed, 1 running, 1 interrupted, 1 not started, "
        "1 waiting for tuning (7 runs)"
    )
    text = render(status_table(rows, "ciresan-sd-quick"))
    assert_fits(text, [r["run_id"] for r in rows] + statuses + [_hash("complete")[:12]])
    assert _hash("complete") not in text
    assert "1 complete, 1 diverged, 1 failed" in text
    assert (
        status_counts([{"status": "complete"}] * 2) == "2 complete, 0 diverged, 0 failed (2 runs)"
    )


def test_study_run_progress_lines_fit():
    for rid in ("tune-residual_dropout-lr0.001-s1", "main-sd_decreasing-s103"):
        out = RunOutcome(
            rid, "tuning", "x", 1, 0.001, "/tmp/x", "retried", "diverged", _hash(rid), 1234.5
        )
        line = progress_line(out)
        assert len(line) <= 80, line
        assert rid in line and _hash(rid)[:12] in line


def _study_summary() -> dict:
    fp = {"dataset": "mnist", "epochs": 5, "batch": 64, "widths": [250]}

    def rec(recipe, seed, acc, status="complete"):
        return RunRecord(
            recipe=recipe,
            seed=seed,
            lr=0.03,
            status=status,
            classes=10,
            selected={"test_acc": acc, "test_ce": 1 - acc, "val_ce": 0.1, "epoch": 4},
            final={"test_acc": acc + 0.001, "test_ce": 1.001 - acc, "val_ce": 0.2, "epoch": 5},
            fit_acc_final=0.99,
            training_clock_s=12.0 + seed % 3,
            elapsed_s=18.0,
            curve=[(0, 0.0, 0.0, 0.1), (5, 12.0, 18.0, 0.96)],
            config_fingerprint=fp,
            fit_ce_final=0.01,
            n_test=10_000,
        )

    recs = []
    for i, recipe in enumerate(RECIPES):
        for j, seed in enumerate((101, 102, 103)):
            noise = (0.003, -0.004, 0.002)[j] if recipe == "sd_constant" else 0.0003 * j
            recs.append(rec(recipe, seed, 0.90 + 0.015 * i + noise))
    recs[-1] = rec("sd_decreasing", 103, math.nan, status="diverged")
    stats = summarise_study(recs, reference="residual", target_val_acc=0.9)
    grid = [
        {
            "recipe": r,
            "lr": lr,
            "status": "diverged" if lr == 0.1 else "complete",
            "val_ce": None if lr == 0.1 else 0.1234,
            "selected_epoch": None if lr == 0.1 else 4,
            "diverged_epoch": 2 if lr == 0.1 else None,
        }
        for r in RECIPES
        for lr in (0.01, 0.03, 0.1)
    ]
    return {
        "study": "ciresan-sd-quick",
        "description": "",
        "scale_down": [],
        "scale_down_sentence": "Scaled down from the full protocol (preset ciresan-sd): 5 epochs instead of 100.",
        "devices": ["cpu"],
        "tuning": {
            "enabled": True,
            "seed": 1,
            "lrs": [0.01, 0.03, 0.1],
            "rule": "minimum validation CE",
            "grid": grid,
            "selected_lr": dict.fromkeys(RECIPES, 0.03),
        },
        "runs": {},
        "stats": json.loads(json.dumps(stats)),
    }


def test_study_summary_fits_with_every_verdict_word_intact():
    summary = _study_summary()
    verdicts = {c["verdict"] for c in summary["stats"]["comparisons"]}
    assert {"not established", "no comparison", "better"} <= verdicts
    text = render(call=lambda c: print_summary(summary, c))
    assert_fits(text, [*RECIPES, "not established", "no comparison", "diverged", "5 epochs"])
    # every comparison row shows its verdict word whole, on the recipe's line
    rows = [line for line in text.splitlines() if line.startswith(RECIPES) and "(pp)" in line]
    assert len(rows) == 2 * (len(RECIPES) - 1)
    assert all(
        line.rstrip().endswith(
            ("better", "worse", "equivalent", "not established", "no comparison", "fragile")
        )
        for line in rows
    )


def test_data_tables_fit_and_shorten_hashes():
    spec = DATASETS["mnist"]
    rows = [
        {
            "file": f.name,
            "sha256": f.sha256,
            "path": f"/root/.cache/fathom/mnist/{f.name}",
            "source": "mirror",
        }
        for f in spec.files
    ]
    text = render(files_table("mnist: verified (SHA-256) and available", rows))
    assert_fits(text, [f.name for f in spec.files] + [f.sha256[:12] for f in spec.files])
    assert spec.files[0].sha256 not in text
    assert "in /root/.cache/fathom/mnist" in text
    wide = render(files_table("mnist", rows, wide=True), width=250)
    assert spec.files[0].sha256 in wide
    mixed = [dict(rows[0]), {**rows[1], "path": "/data/elsewhere/" + rows[1]["file"]}]
    assert "/data/elsewhere/" in render(files_table("mnist", mixed))
    for name in sorted(DATASETS):
        row = info(DATASETS[name])
        assert_fits(render(info_table(row)), [name, *row["files"]])


def test_depth_scaling_tables_fit():
    recs = []
    for depth, acc in {4: 0.614, 8: 0.522, 12: 0.102, 16: 0.037, 20: 0.010}.items():
        for seed in (0, 1):
            recs.append(
                DepthRecord(
                    depth,
                    "vanilla",
                    seed,
                    "complete",
                    acc,
                    None,
                    kappa=1.2e9,
                    grad_norm=4.57e-1,
                    lyapunov=1.9,
                    n_test=10_000,
                )
            )
            recs.append(
                DepthRecord(
                    depth,
                    "Lyapunov",
                    seed,
                    "complete",
                    0.010,
                    None,
                    kappa=2.5e7,
                    grad_norm=8.82e-2,
                    lyapunov=2.7,
                    n_test=10_000,
                )
            )
    results = build_table(recs, classes=100, dataset="cifar100")
    text = render(call=lambda c: print_results(results, "Setup: ANN.", c))
    assert_fits(text, ["trained", "failed", "61.40", "1.2e+09", "8.82e-02", "no conclusion"])


def test_wide_and_json_flags_exist_on_every_listing():
    from fathom.cli import build_parser

    parser = build_parser()
    for argv in (
        ["runs", "list"],
        ["study", "status", "d"],
        ["data", "fetch"],
        ["data", "verify"],
        ["data", "info"],
    ):
        args = parser.parse_args([*argv, "--wide", "--json"])
        assert isinstance(args, argparse.Namespace) and args.wide and args.json
