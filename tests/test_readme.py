"""The README's plain-loop stochastic-depth snippet runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def stochastic_depth_snippet() -> str:
    text = README.read_text()
    section = text[text.index("- **Stochastic depth.**") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "README Stochastic depth section lost its python snippet"
    lines = block.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


def test_readme_stochastic_depth_snippet_runs(capsys):
    torch.set_num_threads(1)
    namespace: dict = {}
    exec(compile(stochastic_depth_snippet(), str(README), "exec"), namespace)
    scores, flops, model = namespace["scores"], namespace["flops"], namespace["model"]
    assert scores.masks.shape == (4, 2) and flops.shape == (4,)
    assert flops[0] < flops[1] < flops[3] and flops[0] < flops[2] < flops[3]
    assert not model.training
    assert "[" in capsys.readouterr().out


def notebook_blocks() -> tuple[list[str], str]:
    """The shell lines and the Python snippet of the README's "In a notebook" section."""
    text = README.read_text()
    section = text[text.index("## In a notebook") :]
    section = section[: section.index("\n## ")]
    shell = re.search(r"```bash\n(.*?)```", section, re.S)
    python = re.search(r"```python\n(.*?)```", section, re.S)
    assert shell is not None and python is not None, "README In a notebook lost its snippets"
    return [line for line in shell.group(1).splitlines() if line.strip()], python.group(1)


def test_readme_notebook_snippets_run(tmp_path, monkeypatch, capsys):
    """The shell lines as written (``python`` is this interpreter, ``fathom`` the CLI's
    ``main``), in an empty folder, then the Python snippet on the run they made."""
    import shlex
    import subprocess
    import sys

    from fathom import cli

    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    shell, python = notebook_blocks()
    assert [shlex.split(line)[0] for line in shell] == ["python", "fathom"]
    for line in shell:
        argv = shlex.split(line)
        if argv[0] == "python":
            subprocess.run([sys.executable, *argv[1:]], check=True, timeout=120)
        else:
            assert cli.main(argv[1:]) == 0
    namespace: dict = {}
    exec(compile(python, str(README), "exec"), namespace)
    run, state, model = namespace["run"], namespace["state"], namespace["model"]
    assert run.status == "complete" and "status='complete'" in capsys.readouterr().out
    history = namespace["history"]
    rows = history if isinstance(history, list) else history.to_dict("records")
    epochs = [r["epoch"] for r in rows]  # the observed epochs (eval.every): first and last
    assert epochs[0] == 0 and epochs[-1] == 3 and epochs == sorted(epochs)
    assert all(r["val/acc_pct"] == 100 * raw["val/acc"] for r, raw in zip(rows, run.dir.history()))
    assert set(state) == set(dict(model.state_dict())) - {
        k for k in model.state_dict() if k.endswith("_extra_state")
    }
    assert not model.training
