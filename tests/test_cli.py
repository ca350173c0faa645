"""The command line itself: lazy start-up, `python -m fathom`, completion, the command table."""

from __future__ import annotations

import argparse
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fathom import cli

SRC = str(Path(__file__).resolve().parents[1] / "src")
HEAVY = ("torch", "numpy", "scipy", "pydantic", "rich", "safetensors")


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_help_imports_no_heavy_module():
    code = (
        "import sys\n"
        "from fathom.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = _python("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert "depth-scaling" in out.stdout and "completion" in out.stdout


def _command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list:
    """Every command path of the full parser: ``("study",), ("study", "run"), ...``."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [(*prefix, name), *_command_paths(sub, (*prefix, name))]
    return out


RUNNER = f"""
import contextlib, io, json, os, sys
from fathom.cli import main
for line in sys.stdin:
    argv = json.loads(line)
    pid = os.fork()
    if pid == 0:  # a fresh child per command: nothing imported by an earlier one
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code
        heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
        print(json.dumps([argv, code, heavy, buf.getvalue()]), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""
"""Runs ``fathom <argv>`` for each JSON line of stdin in a fresh forked interpreter; prints
``[argv, exit status, heavy modules imported, output]``."""


def run_fresh(argvs: list[list[str]]) -> list[tuple[list[str], int, list[str], str]]:
    """:data:`RUNNER` over ``argvs``: one fresh process per command line."""
    import json

    out = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input="".join(json.dumps(a) + "\n" for a in argvs),
        capture_output=True,
        text=True,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[[")]
    assert [r[0] for r in rows] == argvs
    return [tuple(r) for r in rows]


def test_every_subcommand_help_imports_no_heavy_module():
    """``fathom <command> [<subcommand>] --help`` for every command path: no torch, numpy, ..."""
    paths = _command_paths(cli.build_parser())
    assert len(paths) > 20 and ("study", "run") in paths and ("diagnose", "head") in paths
    for argv, code, heavy, text in run_fresh([[*p, "--help"] for p in paths]):
        assert code == 0 and f"usage: fathom {' '.join(argv[:-1])}" in text, (argv, text[:200])
        assert heavy == [], f"fathom {' '.join(argv)} imported {heavy}"


def test_help_defaults_name_the_real_defaults():
    """The help texts that cannot import their constant (it costs torch) agree with it."""
    from fathom.audit import cli as audit_cli
    from fathom.audit.masks import MAX_ENUMERATED_MASKS
    from fathom.telemetry import cli as telemetry_cli
    from fathom.telemetry.docs import DEFAULT_PATH
    from fathom.train.qualify import DEFAULT_GATE

    assert audit_cli.MAX_MASKS_HELP == MAX_ENUMERATED_MASKS
    assert float(telemetry_cli.GATE_HELP) == DEFAULT_GATE
    assert str(DEFAULT_PATH) == "docs/metrics.md"  # the --out help of `telemetry docs`
    args = cli.build_parser().parse_args(["telemetry", "qualify"])
    assert args.gate is None  # resolved to DEFAULT_GATE when the command runs


def test_depth_scaling_refuses_an_unknown_preset_with_the_list(capsys):
    """``--preset`` has no argparse choices (they cost torch at --help): the config says no."""
    assert cli.main(["depth-scaling", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'nope'" in err and "quick" in err


def test_python_dash_m_fathom_runs_the_cli():
    out = _python("-m", "fathom", "--version")
    assert out.returncode == 0 and out.stdout.strip() == "fathom 0.1.0"
    bad = _python("-m", "fathom", "no-such-command")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_command_table_matches_what_the_modules_register():
    """Every module registers exactly the commands COMMANDS attributes to it, with that help."""
    for module in cli.COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(module).add_parser(sub)
        registered = {a.dest: a.help for a in sub._choices_actions}
        expected = {name: text for name, (m, text) in cli.COMMANDS.items() if m == module}
        assert registered == expected, module


def test_a_command_loads_only_its_module():
    parser = cli.build_parser("runs")
    args = parser.parse_args(["runs", "list"])
    assert args.func.__module__ == "fathom.study.runs_cli"
    # a placeholder for another command has no handler
    stub = cli.build_parser("")
    with pytest.raises(SystemExit):
        stub.parse_args(["--help"])


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script_is_generated_from_the_full_parser(shell, capsys):
    assert cli.main(["completion", shell]) == 0
    script = capsys.readouterr().out
    for word in ("depth-scaling", "curvature", "--checkpoint", "fetch", "verify"):
        assert word in script
    if shell == "bash" and shutil.which("bash"):
        check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert check.returncode == 0, check.stderr


def test_install_hints_name_the_checkout_and_distribution():
    from fathom.errors import DISTRIBUTION, install_hint

    hint = install_hint("plot")
    assert hint == "pip install -e '.[plot]' in the Fathom checkout (distribution fathom-depth)"
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'name = "{DISTRIBUTION}"' in text
    assert 'fathom = "fathom.cli:main"' in text


# ---------------------------------------------------------------------------------------
# Commands that compute nothing answer without torch

LIGHT_FORBIDDEN = ("torch", "numpy", "scipy", "safetensors")
"""What a command that only reads configs, registries or manifests must not import."""


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory) -> Path:
    """A one-run study (synthetic data, 1 epoch) with its registry, trained in this process."""
    from conftest import synthetic_splits
    from fathom.study.backends import LocalBackend
    from fathom.study.config import validate_study_config
    from fathom.study.runner import run_study

    runs = tmp_path_factory.mktemp("light") / "runs"
    study = validate_study_config(
        {
            "study": {"name": "t", "reference": "residual", "recipes": ["residual"]}
            | {"seeds": [101], "lr": 0.05},
            "tuning": {"enabled": False},
            "base": {
                "device": "cpu",
                "model": {"widths": [16, 12, 10, 8, 8]},
                "optim": {"epochs": 1, "batch_size": 64},
            },
        }
    )
    backend = LocalBackend(splits_for=lambda cfg, device: synthetic_splits(n_fit=128, n_eval=64))
    run_study(study, runs, backend)
    (runs.parent / "run.toml").write_text("[model]\nwidths = [8, 8]\n[optim]\nlr = 0.05\n")
    (runs.parent / "bad.toml").write_text("[optim]\nlrr = 0.05\n")
    (runs.parent / "empty.toml").write_text("")
    (runs.parent / "nofactory.toml").write_text('[model]\nkind = "python"\nfactory = "no_mod:f"\n')
    return runs


LIGHT_PATHS: tuple[tuple[tuple[str, ...], int, str], ...] = (
    (("validate", "ciresan-fast"), 0, "valid run config"),
    (("validate", "ciresan-sd-quick"), 0, "valid study config"),
    (("validate", "quick"), 0, "valid depth_scaling config"),
    (("validate", "{d}/run.toml"), 0, "valid run config"),
    (("validate", "{d}/bad.toml"), 2, "unknown key 'optim.lrr'"),
    (("validate", "ciresan-fsat"), 2, "did you mean 'ciresan-fast'?"),
    (("validate", "{d}/empty.toml"), 2, "empty.toml is empty"),
    (("validate", "{d}/nofactory.toml"), 2, "cannot import module 'no_mod'"),
    (("train", "{d}/empty.toml"), 2, "empty.toml is empty"),
    (("train", "ciresan-fsat"), 2, "did you mean 'ciresan-fast'?"),
    (("train", "ciresan-fast", "--set", "optim.lrr=0.1"), 2, "did you mean 'optim.lr'?"),
    (("train", "{d}/bad.toml"), 2, "unknown key 'optim.lrr'"),
    (("train", "--live", "bogus"), 2, "bogus"),
    (("study", "run", "ciresan-sd-quik"), 2, "did you mean 'ciresan-sd-quick'?"),
    (("study", "run", "{d}/bad.toml"), 2, "error"),
    (("depth-scaling", "--preset", "quik"), 2, "did you mean 'quick'?"),
    (("trian",), 2, "did you mean 'train'?"),
    (("study", "stauts"), 2, "did you mean 'status'?"),
    (("data", "info", "mnist"), 0, "mnist"),
    (("data", "info", "mnsit"), 2, "did you mean 'mnist'?"),
    (("data", "info"), 0, "cifar100"),
    (("data", "verify", "mnist", "--data-dir", "{d}/nothing-here"), 2, "does not exist"),
    (("data", "fetch", "mnist", "--data-dir", "{d}/nothing-here"), 2, "does not exist"),
    (("study", "status", "{d}/runs/t"), 0, "main-residual-s101"),
    (("study", "status", "{d}/runs/t", "--json"), 0, '"status": "complete"'),
    (("runs", "list", "--runs-dir", "{d}/runs"), 0, "main-residual-s101"),
    (("runs", "show", "nope", "--runs-dir", "{d}/runs"), 2, "no run 'nope'"),
    (("runs", "show", "main-residual-s101", "--runs-dir", "{d}/runs"), 0, '"problems": []'),
    (("telemetry", "docs", "--out", "{d}/metrics.md"), 0, ""),
    (("audit", "{d}/nothing-here"), 2, "does not exist"),
    (("curvature", "{d}/nothing-here", "--epochs", "0"), 2, "not a run directory"),
    (("reproduce", "quik"), 2, "did you mean 'quick'?"),
)
"""(argv, exit status (None: either), text the output holds); ``{d}`` is the study's parent.
``runs show RUN`` checks every weights file against its recorded file SHA-256, by bytes."""


def test_commands_that_compute_nothing_import_no_torch(tiny_study: Path):
    """Config validation of every kind, presets, data info / verify, study status, the
    registry, telemetry docs, and every error a typo meets before computing: no torch,
    numpy, scipy or safetensors in ``sys.modules`` when the command returns."""
    d = str(tiny_study.parent)
    argvs = [[a.format(d=d) for a in argv] for argv, _, _ in LIGHT_PATHS]
    for (argv, want, text), (_, code, heavy, out) in zip(LIGHT_PATHS, run_fresh(argvs)):
        forbidden = [m for m in heavy if m in LIGHT_FORBIDDEN]
        assert forbidden == [], f"fathom {' '.join(argv)} imported {forbidden}"
        assert want is None or code == want, (argv, code, out[-500:])
        assert text in out, (argv, out[-500:])
    assert (tiny_study.parent / "metrics.md").read_text().startswith("#")


def test_runs_show_finds_damaged_and_missing_weights_by_bytes(tiny_study, tmp_path, capsys):
    """A flipped byte in a checkpoint and a deleted selected-weights file are problems in
    ``runs show`` (file SHA-256 against the manifest, no tensors loaded), as in the deep check."""
    import json
    import shutil

    from fathom.rundir import RunDir

    runs = Path(shutil.copytree(tiny_study, tmp_path / "runs"))
    show = ["runs", "show", "main-residual-s101", "--runs-dir", str(runs)]
    assert cli.main(show) == 0
    path = Path(json.loads(capsys.readouterr().out)["path"])
    assert path.is_relative_to(runs)
    m = RunDir(path).manifest
    epoch, entry = next(iter(m["checkpoints"].items()))
    data = bytearray((path / entry["file"]).read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / entry["file"]).write_bytes(bytes(data))
    selected = m["selected_checkpoint"]["file"]
    if selected != entry["file"]:
        (path / selected).unlink()
    assert cli.main(show) == 0
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any(f"epoch {epoch}" in p and "fails its hash check" in p for p in problems), problems
    if selected != entry["file"]:
        assert any(f"{selected} is missing" in p for p in problems), problems
    deep = RunDir(path).problems(deep=True)
    assert any(entry["file"].split("/")[-1] in p for p in deep), deep
