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
    assert args.func.__module__ == "fathom.study.cli"
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
