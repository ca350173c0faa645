"""``fathom audit`` end to end: a tiny MNIST run (skipped without local MNIST) and bad input."""

from __future__ import annotations

import json

import pytest
import torch

from fathom.audit.cli import settings_from_args
from fathom.cli import build_parser, main
from fathom.config import RunConfig
from fathom.errors import FathomError
from fathom.train.loop import train

torch.set_num_threads(1)


def tiny_config(**data) -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "tiny",
            "seed": 7,
            "device": "cpu",
            "data": {"fit_subset": 400, "eval_subset": 400, **data},
            "model": {"recipe": "sd_constant", "widths": [32, 24, 16, 12, 8]},
            "optim": {"epochs": 2, "batch_size": 50},
            "eval": {"every": 1, "first": [1]},
            "checkpoints": {"save_epochs": [2]},
        }
    )


def have_mnist() -> bool:
    from fathom.data import load_raw

    try:
        load_raw("mnist", download=False)
    except Exception:
        return False
    return True


@pytest.mark.skipif(not have_mnist(), reason="MNIST is not available locally")
def test_cli_audits_a_run_directory(tmp_path, capsys):
    pytest.importorskip("sklearn")
    run = tmp_path / "runs" / "tiny"
    train(tiny_config(), run)
    rc = main(
        [
            "audit",
            str(run),
            "--checkpoint",
            "both",
            "--quiet",
            "--margin-bins",
            "2",
            "--timing-batch-sizes",
            "8",
            "--timing-repeats",
            "1",
            "--permutations",
            "20",
        ]
    )
    assert rc == 0
    assert "wrote" in capsys.readouterr().out
    result = json.loads((run / "audit" / "audit.json").read_text())
    assert set(result["runs"][0]["checkpoints"]) == {"selected", "final"}
    assert (run / "audit" / "tiny" / "final.npz").exists()
    assert result["runs"][0]["split_hash"] is not None


def test_cli_reports_bad_input(tmp_path, capsys):
    assert main(["audit", str(tmp_path / "nowhere"), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["audit", str(tmp_path / "empty"), "--quiet", "--no-router"]) == 2
    assert "no run directories" in capsys.readouterr().err


def test_cli_options_become_settings():
    args = build_parser().parse_args(
        ["audit", "x", "--checkpoint", "both", "--contrast", "7:1,2", "--sample-masks", "20"]
    )
    s = settings_from_args(args)
    assert s.checkpoints == ("selected", "final")
    assert (s.contrast_a, s.contrast_b) == (7, (1, 2))
    assert s.sample_masks == 20 and s.timing_batch_sizes == (1, 256)
    bad = build_parser().parse_args(["audit", "x", "--contrast", "1-4"])
    with pytest.raises(FathomError, match="A:B1,B2"):
        settings_from_args(bad)
    bad = build_parser().parse_args(["audit", "x", "--timing-batch-sizes", "0"])
    with pytest.raises(FathomError, match="positive"):
        settings_from_args(bad)
