"""`fathom depth-scaling` end to end on a tiny quick-preset run, and bad input."""

from __future__ import annotations

import argparse
import json
import random
import signal
import time

import pytest
import torch

from fathom.base.io import read_jsonl, state_dict_digest
from fathom.depthscale.cli import add_parser
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.rundir.files import load_weights

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
    assert "| depth | vanilla acc (%) | Lyapunov acc (%) |" in md and "preset quick" in md


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


def _bench_argv(out, extra=()) -> list[str]:
    argv = ["quick", "--depths", "4", "--epochs", "3", "--timesteps", "2"]
    argv += ["--fit-subset", "128", "--eval-subset", "32", "--out", str(out), "--quiet"]
    return [*argv, *extra]


def _bench_cli(forked, out, extra=()):
    """``fathom depth-scaling`` in a real process (a fork of this one, :mod:`forked`)."""
    return forked(["depth-scaling", *_bench_argv(out, extra)], env={"OMP_NUM_THREADS": "1"})


def _rows(run_dir):
    rows, _ = read_jsonl(run_dir / "history.jsonl")
    return [{k: v for k, v in r.items() if not k.startswith("clock/")} for r in rows]


def test_depth_scaling_resumes_byte_identically_after_sigkill(tmp_path, forked):
    # the reference runs in this process; the victim (killed by SIGKILL at a moment it cannot
    # choose) and the rerun that resumes it are real processes forked from this one
    pytest.importorskip("fathom.data")
    assert run(_bench_argv(tmp_path / "ref")) == 0
    victim = _bench_cli(forked, tmp_path / "v")
    first = tmp_path / "v" / "d04-vanilla-s0"
    deadline = time.time() + 600
    while time.time() < deadline:
        rows = read_jsonl(first / "history.jsonl")[0] if first.exists() else []
        if len(rows) >= 2:  # epoch 0's evaluation and epoch 1 (its checkpoint) are written
            break
        assert victim.poll() is None, victim.output()
        time.sleep(0.02)
    # land at a random moment of epoch 2 (not the last epoch of this run): within 0.8 of the
    # time epoch 1 took, training and evaluation
    epoch_s = rows[1]["clock/unix_s"] - rows[0]["clock/unix_s"]
    time.sleep(random.uniform(0.0, 0.8 * epoch_s))
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    assert RunDir(first).status == "running"
    again = _bench_cli(forked, tmp_path / "v")
    out = "".join(again.communicate(timeout=900))
    assert again.returncode == 0, out
    assert "resuming" not in out  # --quiet
    for name in ("d04-vanilla-s0", "d04-lyapunov-s0"):
        mine, theirs = RunDir(tmp_path / "v" / name), RunDir(tmp_path / "ref" / name)
        assert mine.status == theirs.status == "complete"
        for key in ("initial_params", "final_params", "training_order"):
            assert mine.manifest["hashes"][key] == theirs.manifest["hashes"][key], (name, key)
        assert _rows(tmp_path / "v" / name) == _rows(tmp_path / "ref" / name)
    assert (tmp_path / "v" / "table.json").read_text() == (
        tmp_path / "ref" / "table.json"
    ).read_text().replace(str(tmp_path / "ref"), str(tmp_path / "v"))


def test_a_benchmark_directory_holding_another_benchmark_is_refused(quick_run):
    with pytest.raises(FathomError, match="holds another depth-scaling benchmark"):
        run(["quick", "--depths", "4", "--epochs", "2", "--out", str(quick_run), "--quiet"])


def test_workers_run_the_same_runs_as_the_sequential_path(tmp_path):
    """``--workers 2`` (the study's local backend) ends every run with the same final
    weights as the sequential path, and a rerun skips them all."""
    pytest.importorskip("fathom.data")
    common = ["--preset", "quick", "--depths", "4", "--epochs", "1", "--timesteps", "0"]
    common += ["--fit-subset", "32", "--eval-subset", "16", "--quiet"]
    assert run([*common, "--out", str(tmp_path / "seq")]) == 0
    assert run([*common, "--out", str(tmp_path / "par"), "--workers", "2"]) == 0

    def finals(root):
        return {
            p.name: RunDir(p).manifest["hashes"]["final_params"]
            for p in sorted(root.iterdir())
            if p.is_dir()
        }

    seq, par = finals(tmp_path / "seq"), finals(tmp_path / "par")
    assert list(par) == ["d04-lyapunov-s0", "d04-vanilla-s0"] and par == seq
    assert all(RunDir(tmp_path / "par" / n).manifest["status"] == "complete" for n in par)
    assert (tmp_path / "par" / "table.json").read_text() != ""
    mtimes = {n: (tmp_path / "par" / n / "manifest.json").stat().st_mtime_ns for n in par}
    assert run([*common, "--out", str(tmp_path / "par"), "--workers", "2"]) == 0
    assert mtimes == {
        n: (tmp_path / "par" / n / "manifest.json").stat().st_mtime_ns for n in par
    }  # complete runs skipped


def test_workers_must_be_positive(tmp_path):
    with pytest.raises(FathomError, match="--workers must be at least 1"):
        run(["--preset", "quick", "--out", str(tmp_path / "x"), "--workers", "0", "--quiet"])
