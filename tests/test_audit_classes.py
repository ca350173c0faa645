"""``fathom audit RUN_DIR``'s default class contrast: the registered dataset's own (MNIST's
digit 1 against 4 and 9, its look-alikes), never a digit contrast on other data (on CIFAR-10 or
Fashion-MNIST "1 vs 4, 9" would name arbitrary classes), else class 0 vs the rest."""

from __future__ import annotations

import pytest
import torch

from conftest import synthetic_splits, tiny_config
from fathom.audit.checkpoint import AuditSettings
from fathom.audit.run import audit_runs
from fathom.train.loop import train

pytestmark = pytest.mark.usefixtures("needs_sklearn")


def test_contrast_defaults_follow_the_dataset() -> None:
    s = AuditSettings()
    assert s.contrast_for(10, "mnist") == (1, (4, 9), "default for mnist (1 vs 4, 9)")
    for other in ("cifar10", "fashion-mnist", "synthetic", None):
        assert s.contrast_for(10, other)[:2] == (0, tuple(range(1, 10)))
    assert s.contrast_for(100, "cifar100")[:2] == (0, tuple(range(1, 100)))
    assert s.contrast_for(4)[:2] == (0, (1, 2, 3)) and s.contrast_for(2)[:2] == (0, (1,))
    # MNIST's contrast names classes 1, 4 and 9: a subset of fewer classes falls back
    assert s.contrast_for(5, "mnist")[:2] == (0, (1, 2, 3, 4))
    given = AuditSettings(contrast_a=2, contrast_b=(0,))
    assert given.contrast_for(3) == (2, (0,), "given (--contrast)")


def test_the_cli_default_leaves_the_contrast_to_the_data() -> None:
    from fathom.audit.cli import settings_from_args
    from fathom.cli import build_parser

    s = settings_from_args(build_parser().parse_args(["audit", "x"]))
    assert (s.contrast_a, s.contrast_b) == (None, None)


def test_default_audit_of_a_four_class_run(tmp_path) -> None:
    torch.manual_seed(0)
    splits = synthetic_splits(n_fit=128, n_eval=96, classes=4)
    cfg = tiny_config(**{"model.recipe": "sd_constant", "optim.epochs": 2})
    train(cfg, tmp_path / "run", splits=splits)
    settings = AuditSettings(router=False, margin_bins=2, timing_batch_sizes=(4,), timing_repeats=1)
    result = audit_runs(tmp_path / "run", settings, tmp_path / "audit", splits=splits)
    res = result["runs"][0]["checkpoints"]["selected"]["resilience"]
    assert res["contrast"] == {
        "a": 0,
        "b": [1, 2, 3],
        "source": "default for 4 classes (class 0 vs every other class)",
    }
    assert len(res["test"]["class_means"]) == 4


def test_the_class_count_is_the_runs_and_a_model_of_another_width_is_refused(tmp_path) -> None:
    from fathom.audit.checkpoint import audit_checkpoint
    from fathom.errors import FathomError
    from synthetic_audit import _data, _model

    data = _data(64, classes=4)
    settings = AuditSettings(router=False, margin_bins=2)
    meta = {"run_id": "r", "checkpoint": "final", "epoch": "0", "params_sha256": "x"}
    model = _model("residual", 1, 4)
    given = audit_checkpoint(model, data, settings, tmp_path / "a.npz", meta, classes=4)
    width = audit_checkpoint(model, data, settings, tmp_path / "b.npz", meta)
    assert given["resilience"] == width["resilience"]
    assert len(given["resilience"]["test"]["class_means"]) == 4
    with pytest.raises(FathomError, match=r"outputs 4 logits per example .* 10 classes"):
        audit_checkpoint(model, data, settings, tmp_path / "c.npz", meta, classes=10)
