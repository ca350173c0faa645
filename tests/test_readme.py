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
