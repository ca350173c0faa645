"""examples/own_model.py runs as a researcher would run it (real MNIST, a plain loop)."""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "own_model.py"


def run_as_script(path: Path, args: list[str]) -> None:
    """``python PATH ARGS`` in this (forked) process: ``__main__``, ``sys.argv``, its folder
    first on ``sys.path``, as the interpreter runs a script."""
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent))
    runpy.run_path(str(path), run_name="__main__")


def test_own_model_example_end_to_end(tmp_path: Path, forked) -> None:
    # the script runs in a process forked from this one (:mod:`forked`): a researcher's
    # ``python examples/own_model.py`` without paying a fresh interpreter's torch import
    out = tmp_path / "result.json"
    args = ["--epochs", "2", "--steps-per-epoch", "10", "--probe", "32", "--test", "200"]
    args += ["--out", str(out)]
    proc = forked(lambda: run_as_script(EXAMPLE, args), env={"OMP_NUM_THREADS": "1"})
    assert proc.wait(timeout=600) == 0, proc.output()
    stdout = proc.out.read_text()
    res = json.loads(out.read_text())
    assert len(res["rows"]) == 3  # epoch 0 and two epoch boundaries
    for row in res["rows"]:
        assert math.isfinite(row["probe/ce"])
        assert row["grad/pex/diversity/head"] is not None
        assert any(k.endswith("/stage2.0.branch.0") for k in row)  # qualified module names
    # every parameter has every diagonal: nothing silently left out
    for kind in ("ggn", "empirical_fisher", "jacobian_gram"):
        assert res["diagonal_params"][kind] == sorted(res["parameters"])
        assert res["traces"][kind] > 0
    masks = [tuple(m) for m in res["masks"]]
    assert len(set(masks)) == 8  # 2^3 branch masks
    full = masks.index((1, 1, 1))
    assert res["mask_damage"][full] == 0.0
    flops = dict(zip(masks, res["mask_flops"], strict=True))
    assert flops[(0, 0, 0)] < flops[(1, 0, 0)] < flops[(1, 1, 1)]  # dropped branches cost nothing
    assert flops[(0, 1, 0)] == flops[(0, 0, 1)]  # equal branches, equal cost
    assert "dense test accuracy" in stdout
