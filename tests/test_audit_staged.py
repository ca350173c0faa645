"""`fathom audit` on depth-scaling run directories (StagedConvNet with residual branches)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fathom.audit.checkpoint import AuditSettings
from fathom.audit.evaluate import load_scores
from fathom.audit.run import audit_runs
from fathom.depth import find_branches
from fathom.depthscale.config import make_config, run_config
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.train.loop import train
from test_audit_run import synthetic_splits

pytestmark = pytest.mark.usefixtures("needs_sklearn")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def staged_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    splits = synthetic_splits(n_fit=96, n_eval=120)
    common = dict(neuron="relu", timesteps=0, epochs=1, health_every=1, probe_size=2)
    for residual in (True, False):
        cfg = make_config("quick", residual=residual, **common)
        name = "d08-vanilla-s0" if residual else "d04-plain-s0"
        depth = 8 if residual else 4
        run_cfg = run_config(cfg, depth, "vanilla", 0, "ds").with_updates({"name": name})
        train(run_cfg, root / name, splits=splits)
    return root, splits


SETTINGS = AuditSettings(
    checkpoints=("selected", "final"),
    min_samples_leaf=20,
    n_permutations=20,
    margin_bins=3,
    timing_batch_sizes=(4,),
    timing_repeats=1,
    routed_timing_examples=16,
    routed_timing_repeats=1,
)


def test_depth_scaling_run_is_audited_with_every_mask(staged_runs, tmp_path):
    root, splits = staged_runs
    result = audit_runs(root, SETTINGS, tmp_path / "out", splits=splits)
    assert [r["run_id"] for r in result["runs"]] == ["d08-vanilla-s0"]
    assert "no removable branches" in result["skipped"][0]["reason"]
    run = result["runs"][0]
    assert run["arm"] == "staged_conv-vanilla-d8" and run["seed"] == 0
    rec = run["checkpoints"]["final"]
    assert rec["k"] == 4 and len(rec["masks"]) == 16  # 2 residual blocks in each of 4 stages
    full = next(m for m in rec["masks"] if m["mask"] == "1111")
    empty = next(m for m in rec["masks"] if m["mask"] == "0000")
    assert full["macs_fraction"] == 1.0 and 0 < empty["macs_fraction"] < 1
    # the full mask reproduces the run's own dense evaluation of the model
    from fathom.audit.run import subject_of

    model = subject_of(RunDir(root / "d08-vanilla-s0")).load_model("final", torch.device("cpu"))
    assert len(find_branches(model)) == 4
    scores, _ = load_scores(str(tmp_path / "out" / rec["arrays"]))
    with torch.no_grad():
        dense = model(splits.test_x).numpy()
    np.testing.assert_allclose(scores["test"].logits[-1], dense, rtol=1e-5, atol=1e-5)
    assert "StagedConvNet(" in result["speed"][0]["architecture"]
    assert len(result["speed"][0]["timings"][0]["speedup_vs_dense"]) == 16


def test_non_residual_depth_scaling_run_is_refused_clearly(staged_runs, tmp_path):
    root, splits = staged_runs
    with pytest.raises(FathomError, match="no removable branches.*--residual"):
        audit_runs(root / "d04-plain-s0", SETTINGS, tmp_path / "x", splits=splits)
