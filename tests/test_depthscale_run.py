"""`fathom depth-scaling` end to end on a tiny quick-preset run, and bad input."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from fathom.depthscale.cli import add_parser
from fathom.errors import FathomError
from fathom.io import state_dict_digest
from fathom.train.checkpoint import load_weights

torch.set_num_threads(1)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fathom")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["depth-scaling", *argv])


def run(argv: list[str]) -> int:
    args = parse(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    pytest.importorskip("fathom.data")
    out = tmp_path_factory.mktemp("ds") / "bench"
    argv = [
        "--preset",
        "quick",
        "--depths",
        "4",
        "8",
        "--epochs",
        "1",
        "--timesteps",
        "2",
        "--fit-subset",
        "64",
        "--eval-subset",
        "32",
        "--out",
        str(out),
        "--quiet",
    ]
    assert run(argv) == 0
    return out


def test_quick_run_writes_run_directories_and_a_table(quick_run):
    runs = sorted(p.name for p in quick_run.iterdir() if p.is_dir())
    assert runs == ["d04-lyapunov-s0", "d04-vanilla-s0", "d08-lyapunov-s0", "d08-vanilla-s0"]
    for name in runs:
        manifest = json.loads((quick_run / name / "manifest.json").read_text())
        assert manifest["status"] in ("complete", "diverged")
        assert set(manifest["clocks"]) >= {"training_s", "evaluation_s", "telemetry_s", "elapsed_s"}
        assert manifest["data"]["sizes"] == {"fit": 64, "val": 32, "test": 32}
        rows = [
            json.loads(line)
            for line in (quick_run / name / "history.jsonl").read_text().splitlines()
        ]
        assert [r["epoch"] for r in rows] == [0, 1]
        assert rows[1]["jac/kappa"] is None or rows[1]["jac/kappa"] >= 1
        lyap_arm = "lyapunov" in name
        assert (rows[1]["grad_norm/penalty"] is not None) == lyap_arm
        assert (rows[1]["train/penalty"] is not None) == lyap_arm
        if manifest["status"] == "complete":
            ckpt = manifest["checkpoints"]["1"]
            state, _ = load_weights(quick_run / name / ckpt["file"], ckpt["params_sha256"])
            assert state_dict_digest(state) == manifest["hashes"]["final_params"]
    table = json.loads((quick_run / "table.json").read_text())
    assert [r["depth"] for r in table["rows"]] == [4, 8]
    assert table["verdict"]["verdict"] in (
        "no conclusion",
        "inconclusive",
    )  # one seed: never a claim
    md = (quick_run / "table.md").read_text()
    assert "| depth | vanilla acc | Lyapunov acc |" in md and "preset quick" in md


def test_vanilla_and_lyapunov_arms_start_identical(quick_run):
    a = json.loads((quick_run / "d04-vanilla-s0" / "manifest.json").read_text())
    b = json.loads((quick_run / "d04-lyapunov-s0" / "manifest.json").read_text())
    assert a["hashes"]["initial_params"] == b["hashes"]["initial_params"]
    assert a["hashes"]["training_order"] == b["hashes"]["training_order"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--depths", "4", "6"], "depth 6 is not a positive multiple of the 4 stages"),
        (["--timesteps", "-1"], "timesteps must be >= 0"),
        (["--dataset", "svhn"], "unknown dataset 'svhn'"),
    ],
)
def test_bad_arguments_raise_named_errors(argv, message, tmp_path):
    with pytest.raises(FathomError, match=message):
        run(["--preset", "quick", "--out", str(tmp_path / "x"), "--quiet", *argv])
    assert not (tmp_path / "x").exists()


def test_missing_or_corrupt_cifar_archive_reaches_the_user(tmp_path):
    argv = [
        "--preset",
        "quick",
        "--dataset",
        "cifar100",
        "--data-dir",
        str(tmp_path),
        "--out",
        str(tmp_path / "out"),
        "--quiet",
    ]
    with pytest.raises(FathomError, match=r"cifar-100-python\.tar\.gz"):
        run(argv)
    (tmp_path / "cifar-100-python.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(FathomError, match=r"(?i)sha-?256|checksum|md5|digest"):
        run(argv)
    assert not (tmp_path / "out").exists()
