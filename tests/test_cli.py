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


HELP_RUNNER = f"""
import contextlib, io, json, os, sys
from fathom.cli import main
for line in sys.stdin:
    argv = json.loads(line)
    pid = os.fork()
    if pid == 0:  # a fresh child per command: nothing imported by an earlier help
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            try:
                code = main([*argv, "--help"])
            except SystemExit as e:
                code = e.code
        heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
        print(json.dumps([argv, code, heavy, buf.getvalue()]), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""


def test_every_subcommand_help_imports_no_heavy_module():
    """``fathom <command> [<subcommand>] --help`` for every command path: no torch, numpy, ..."""
    import json

    paths = _command_paths(cli.build_parser())
    assert len(paths) > 20 and ("study", "run") in paths and ("diagnose", "head") in paths
    out = subprocess.run(
        [sys.executable, "-c", HELP_RUNNER],
        input="".join(json.dumps(list(p)) + "\n" for p in paths),
        capture_output=True,
        text=True,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[[")]
    assert [tuple(argv) for argv, *_ in results] == paths
    for argv, code, heavy, text in results:
        assert code == 0 and f"usage: fathom {' '.join(argv)}" in text, (argv, text[:200])
        assert heavy == [], f"fathom {' '.join(argv)} --help imported {heavy}"


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
