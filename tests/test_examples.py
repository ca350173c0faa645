"""examples/own_model.py runs as a researcher would run it (real MNIST, a plain loop)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "own_model.py"


def test_own_model_example_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    args = ["--epochs", "2", "--steps-per-epoch", "30", "--test", "500", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert len(res["rows"]) == 3  # epoch 0 and two epoch boundaries
    for row in res["rows"]:
        assert math.isfinite(row["probe/ce"])
        assert row["grad/pex/diversity/head"] is not None
        assert any(k.endswith("/stage2.0.branch.0") for k in row)  # qualified module names
    # every parameter has every diagonal: nothing silently left out
    for kind in ("ggn", "fisher", "jacobian"):
        assert res["diagonal_params"][kind] == sorted(res["parameters"])
        assert res["traces"][kind] > 0
    masks = [tuple(m) for m in res["masks"]]
    assert len(set(masks)) == 8  # 2^3 branch masks
    full = masks.index((1, 1, 1))
    assert res["mask_damage"][full] == 0.0
    flops = dict(zip(masks, res["mask_flops"], strict=True))
    assert flops[(0, 0, 0)] < flops[(1, 0, 0)] < flops[(1, 1, 1)]  # dropped branches cost nothing
    assert flops[(0, 1, 0)] == flops[(0, 0, 1)]  # equal branches, equal cost
    assert "dense test accuracy" in proc.stdout
