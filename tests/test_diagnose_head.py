"""`fathom diagnose head` on a tiny CPU pair: a matched pair (only the output ReLU differs),
and a per-class table whose counts equal a brute-force count from the saved checkpoints."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

from fathom.config import RunConfig, config_diff
from fathom.reproduce.head import HeadSettings, pair_configs, run_head_diagnostic
from fathom.rundir import RunDir
from test_audit_run import synthetic_splits


def base_config() -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "head",
            "device": "cpu",
            "model": {
                "recipe": "plain",
                "widths": [32, 24, 16, 12, 8],
                "input_scale": 1.0,
                "output_relu": True,
            },
            "optim": {"lr": 0.001, "batch_size": 32, "epochs": 50},
            "eval": {"every": 1},
        }
    )


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    out = tmp_path_factory.mktemp("head") / "pair"
    splits = synthetic_splits()
    said: list[str] = []
    result = run_head_diagnostic(
        base_config(),
        HeadSettings(seed=104, epochs=2),
        out,
        splits_for=lambda cfg, dev: splits,
        progress=said.append,
    )
    return out, result, splits, said


def test_progress_says_each_epoch_of_each_run_with_the_pairs_eta(diagnosed):
    """Per trained epoch ``name (k/2 runs) epoch e/2 ... run ETA ... pair ETA``, per run its end;
    the last line's pair ETA is zero (nothing is left)."""
    said = diagnosed[3]
    epochs = [line for line in said if " epoch " in line]
    assert [line.split(" (")[0] for line in epochs] == ["head-relu"] * 2 + ["head-linear"] * 2
    assert [line.split(" (")[1][:3] for line in epochs] == ["1/2", "1/2", "2/2", "2/2"]
    assert all(f" epoch {e}/2 " in line for e, line in zip((1, 2, 1, 2), epochs, strict=True))
    assert all(" run ETA " in line and " pair ETA " in line for line in epochs)
    ends = [line for line in said if " in " in line and " epoch " not in line]
    assert len(ends) == 2 and ends[-1].endswith("pair ETA 0:00"), said


def test_the_pair_differs_only_in_the_output_relu(diagnosed):
    out = diagnosed[0]
    relu = json.loads((out / "head-relu" / "manifest.json").read_text())["config"]
    lin = json.loads((out / "head-linear" / "manifest.json").read_text())["config"]
    assert {d.split(":")[0] for d in config_diff(relu, lin)} == {"name", "model.output_relu"}
    assert relu["model"]["output_relu"] is True and lin["model"]["output_relu"] is False
    assert (
        relu["seed"] == 104 and relu["optim"]["epochs"] == 2 and relu["model"]["input_scale"] == 1
    )
    cfgs = pair_configs(base_config(), HeadSettings(width_mult=0.5, fit_subset=100), "s")
    assert cfgs["relu"].model.width_mult == 0.5 and cfgs["linear"].data.fit_subset == 100


def brute_force_counts(run_dir, x, y) -> tuple[Counter, Counter]:
    """Correct and total per digit, one example at a time in float64, from the checkpoint file."""
    rd = RunDir(run_dir)
    entry = rd.manifest["checkpoints"][str(rd.manifest["final"]["epoch"])]
    model = rd.build_model()
    model.load_state_dict(load_file(run_dir / entry["file"]))
    model = model.double().eval()
    correct, total = Counter(), Counter()
    with torch.no_grad():
        for i in range(y.shape[0]):
            label = int(y[i])
            total[label] += 1
            correct[label] += int(int(model(x[i : i + 1]).argmax()) == label)
    return correct, total


def test_per_class_table_equals_a_brute_force_count(diagnosed):
    out, result, splits, _ = diagnosed
    lines = (out / "head.md").read_text().splitlines()
    for head in ("relu", "linear"):
        correct, total = brute_force_counts(out / f"head-{head}", splits.test_x, splits.test_y)
        rows = result["heads"][head]["per_class"]
        assert [r["correct"] for r in rows] == [correct[c] for c in range(10)]
        assert [r["total"] for r in rows] == [total[c] for c in range(10)]
        assert result["heads"][head]["accuracy"] == pytest.approx(
            sum(correct.values()) / splits.test_y.shape[0]
        )
    relu, lin = result["heads"]["relu"]["per_class"], result["heads"]["linear"]["per_class"]
    for c in range(10):
        line = (
            f"{c}: {relu[c]['correct']}/{relu[c]['total']} -> {lin[c]['correct']}/{lin[c]['total']}"
        )
        assert line in lines
    # the saved table is recomputed, not retrained, on a second call: same counts, runs skipped
    again = run_head_diagnostic(
        base_config(), HeadSettings(seed=104, epochs=2), out, splits_for=lambda c, d: splits
    )
    assert {h: a["action"] for h, a in again["heads"].items()} == dict.fromkeys(
        ("relu", "linear"), "skipped"
    )
    assert again["heads"]["relu"]["per_class"] == relu


def test_cli_refuses_bad_input(capsys):
    from fathom.cli import main

    assert main(["diagnose", "head", "no-such-preset"]) == 2
    assert "ciresan-fidelity" in capsys.readouterr().err  # the error lists the presets
    assert main(["diagnose", "head", "--epochs", "0"]) == 2
    assert "--epochs must be at least 1" in capsys.readouterr().err
