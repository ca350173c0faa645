"""fathom curvature over a run directory: outputs, hashes, and every bad-input path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fathom.cli import main
from fathom.config import ModelConfig, RunConfig
from fathom.curvature import curvature_snapshot
from fathom.curvature.exact import CURVATURE_FAMILIES, OLD_NAMES
from fathom.curvature.rundir import (
    check_epochs,
    load_diagonals,
    prediction_agreement,
    probe_from_split,
    run_curvature,
)
from fathom.data.splits import DataSplits
from fathom.depth import SkippableResidual
from fathom.errors import FathomError
from fathom.io import atomic_write_json
from fathom.models import build_model
from fathom.provenance import source_hash
from fathom.rundir import RunDir
from fathom.rundir.files import save_weights
from fathom.rundir.weights import cpu_state

torch.set_num_threads(1)
EPOCHS = (0, 1, 5)
IN_FEATURES, CLASSES, FIT = 12, 3, 20


def make_run(root: Path, recipe: str = "sd_constant") -> Path:
    """A run directory by the contract: manifest, hashed safetensors checkpoints (no data files)."""
    cfg = RunConfig(name="tiny", model=ModelConfig(recipe=recipe, widths=(8, 7, 6, 5, 4)))
    run = root / "tiny"
    checkpoints = {}
    torch.manual_seed(0)
    model = build_model(cfg.model, CLASSES, IN_FEATURES)
    for e in EPOCHS:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        rel = f"checkpoints/epoch-{e:04d}.safetensors"
        digest = save_weights(run / rel, cpu_state(model), {"epoch": e, "run_id": "tiny"})
        checkpoints[str(e)] = {"file": rel, "params_sha256": digest}
    atomic_write_json(
        run / "manifest.json",
        {
            "format": 1,
            "run_id": "tiny",
            "status": "complete",
            "config": cfg.model_dump(mode="json"),
            "data": {"info": {"classes": CLASSES, "in_features": IN_FEATURES}},
            "checkpoints": checkpoints,
        },
    )
    return run


class SyntheticDataRunDir(RunDir):
    """A real RunDir whose splits are synthetic uint8 images (no dataset files needed)."""

    def load_splits(self, device="cpu") -> DataSplits:
        g = torch.Generator().manual_seed(7)
        x = torch.randint(0, 256, (FIT, IN_FEATURES), generator=g, dtype=torch.uint8)
        y = torch.randint(0, CLASSES, (FIT,), generator=g)
        return DataSplits(x, y, x[:2], y[:2], x[:2], y[:2], split_hash="synthetic")


def test_snapshots_and_summary_are_written(tmp_path: Path) -> None:
    rd = SyntheticDataRunDir(make_run(tmp_path))
    lines: list[str] = []
    rows = run_curvature(rd, [0, 5], probe=8, progress=lines.append)
    assert [line.split(":")[0] for line in lines] == [
        f"{rd.run_id} epoch 0",
        f"{rd.run_id} epoch 5",
    ]
    assert "1/2 snapshots  elapsed" in lines[0]
    assert "2/2 snapshots" in lines[1] and "ETA 0:00" in lines[1]
    assert [r["epoch"] for r in rows] == [0, 5]
    out = rd.path / "curvature"
    rec = json.loads((out / "epoch-0005.json").read_text())
    assert rec["checkpoint"]["params_sha256"] == rd.checkpoint_hash(5)
    assert rec["checkpoint"]["file"] == "checkpoints/epoch-0005.safetensors"
    assert rec["scope"]["N"] == 8 and rec["scope"]["split"] == "fit"
    assert rec["dtype"] == "float64"
    assert "mean over the N probe examples" in rec["normalization"]
    assert rec["runtime_s"]["total_s"] >= rec["runtime_s"]["compute_s"] > 0
    assert "solver" in rec["layers"][0]["kfac"]["A"]
    assert len(rec["layers"]) == 6
    x, y = probe_from_split(*_fit(rd), 8)
    model = rd.load_model(5, dtype=torch.float64)
    want = curvature_snapshot(model, x, y).record["totals"]["ggn_weight_trace"]
    assert rec["totals"]["ggn_weight_trace"] == pytest.approx(want, rel=1e-14)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["epoch"] for r in summary["rows"]] == [0, 5]
    assert summary["rows"][1]["params_sha256"] == rd.checkpoint_hash(5)
    assert "| epoch |" in (out / "summary.md").read_text()
    prov = rec["provenance"]
    assert prov["source_sha256"] == source_hash() == summary["source_sha256"]
    assert prov["checkpoint_sha256"] == rd.checkpoint_hash(5)
    agree = prov["prediction_agreement"]
    assert agree["argmax_agreement"] == 1.0
    assert 0 < agree["max_abs_logit_diff"] < 1e-4 * max(1.0, agree["max_abs_logit"])


def test_prediction_agreement_detects_a_different_model() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    x = torch.randn(50, 4)
    logits64 = model.double()(x.double()).detach()
    other = nn.Sequential(nn.Linear(4, 3))
    rec = prediction_agreement(logits64, other, x)
    assert rec["argmax_agreement"] < 0.9 and rec["max_abs_logit_diff"] > 0.1
    same = prediction_agreement(logits64, model.float(), x)
    assert same["argmax_agreement"] == 1.0 and same["max_abs_logit_diff"] < 1e-5


def _fit(rd: RunDir) -> tuple[torch.Tensor, torch.Tensor]:
    s = rd.load_splits()
    return s.fit_x, s.fit_y


def test_diagonals_file_on_request(tmp_path: Path) -> None:
    rd = SyntheticDataRunDir(make_run(tmp_path))
    run_curvature(rd, [1], probe=4, out_dir=tmp_path / "out", save_diagonals=True)
    rec = json.loads((tmp_path / "out" / "epoch-0001.json").read_text())
    from safetensors.torch import load_file

    tensors = load_file(tmp_path / "out" / rec["diagonals_file"])
    assert tensors["ggn/stem.weight"].shape == (8, IN_FEATURES)
    assert rec["layers"][0]["name"] == "stem"
    assert rec["layers"][0]["ggn_weight_trace"] == pytest.approx(
        float(tensors["ggn/stem.weight"].sum())
    )
    model = rd.load_model(1)
    assert sorted(tensors) == sorted(
        f"{k}/{n}" for k in CURVATURE_FAMILIES for n, _ in model.named_parameters()
    )
    diags = load_diagonals(tmp_path / "out" / rec["diagonals_file"])
    assert list(diags) == list(CURVATURE_FAMILIES)
    assert all(
        torch.equal(diags[k][n], tensors[f"{k}/{n}"]) for k in CURVATURE_FAMILIES for n in diags[k]
    )


def test_diagonals_file_written_with_the_old_family_names_reads(tmp_path: Path) -> None:
    """A diagonals file from before the rename (``fisher/``, ``jacobian/``) reads under the
    families' one name; its record's traces (always ``empirical_fisher_*``) still agree."""
    from safetensors.torch import save_file

    rd = SyntheticDataRunDir(make_run(tmp_path))
    run_curvature(rd, [1], probe=4, out_dir=tmp_path / "out", save_diagonals=True)
    rec = json.loads((tmp_path / "out" / "epoch-0001.json").read_text())
    new = load_diagonals(tmp_path / "out" / rec["diagonals_file"])
    back = {v: k for k, v in OLD_NAMES.items()}
    old = {f"{back.get(k, k)}/{n}": t for k, per in new.items() for n, t in per.items()}
    assert any(key.startswith("fisher/") for key in old)
    save_file(old, tmp_path / "old.safetensors")
    got = load_diagonals(tmp_path / "old.safetensors")
    assert list(got) == list(CURVATURE_FAMILIES)
    assert all(torch.equal(got[k][n], new[k][n]) for k in CURVATURE_FAMILIES for n in new[k])
    stem = rec["layers"][0]
    assert stem["empirical_fisher_weight_trace"] == pytest.approx(
        float(got["empirical_fisher"]["stem.weight"].sum())
    )


@pytest.mark.parametrize("content", [b"not safetensors", None])
def test_diagonals_file_not_ours_is_refused(tmp_path: Path, content: bytes | None) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "d.safetensors"
    if content is None:
        save_file({"hessian/w": torch.zeros(2)}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(FathomError, match="diagonals"):
        load_diagonals(path)


def test_missing_epochs_list_what_exists(tmp_path: Path) -> None:
    rd = SyntheticDataRunDir(make_run(tmp_path))
    with pytest.raises(FathomError, match=r"epoch\(s\) \[10, 20\].*saved epochs \[0, 1, 5\]"):
        run_curvature(rd, [0, 10, 20], probe=4)
    assert not (rd.path / "curvature").exists()
    assert check_epochs([0, 1], None) == [0, 1]


def test_hash_mismatch_fails_before_any_output(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    rd = SyntheticDataRunDir(run)
    state = rd.load_state(5)
    state["head.bias"] = state["head.bias"] + 1.0
    save_weights(run / "checkpoints/epoch-0005.safetensors", state, {"epoch": 5})
    with pytest.raises(FathomError, match="fails its hash check"):
        run_curvature(rd, [0, 5], probe=4)
    assert not (run / "curvature").exists()


def test_probe_larger_than_split(tmp_path: Path) -> None:
    rd = SyntheticDataRunDir(make_run(tmp_path))
    with pytest.raises(FathomError, match=f"larger than the fitting split \\({FIT} examples\\)"):
        run_curvature(rd, [0], probe=FIT + 1)


class OwnConvNet(nn.Module):
    """A user's model: Conv2d + BatchNorm + pooling + a residual branch, on the 12 features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.block = SkippableResidual(nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), nn.Tanh()))
        self.head = nn.Linear(3 * 2 * 2, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, 1, 3, 4).to(self.conv.weight.dtype) / 255
        h = self.block(torch.relu(self.bn(self.conv(h))))
        return self.head(nn.functional.adaptive_avg_pool2d(h, 2).flatten(1))


class OwnModelRunDir(SyntheticDataRunDir):
    def load_model(self, which, dtype=torch.float32, device="cpu") -> nn.Module:
        torch.manual_seed(3)
        return OwnConvNet().to(dtype).eval()


def test_any_model_the_run_builds_gets_curvature(tmp_path: Path) -> None:
    rd = OwnModelRunDir(make_run(tmp_path))
    rows = run_curvature(rd, [0], probe=6)
    rec = json.loads((rd.path / "curvature" / "epoch-0000.json").read_text())
    assert rec["model_type"] == "OwnConvNet"
    types = {layer["name"]: layer["type"] for layer in rec["layers"]}
    assert types == {
        "conv": "Conv2d",
        "bn": "BatchNorm2d",
        "block.branch.0": "Conv2d",
        "head": "Linear",
    }
    assert rec["kfac_not_covered"] == [{"layer": "bn", "type": "BatchNorm2d"}]
    assert rec["layers"][0]["kfac"]["positions_per_example"] == 12
    assert set(rec["coverage"]) == {n for n, _ in OwnConvNet().named_parameters()}
    assert rows[0]["ggn_weight_trace"] > 0


def test_a_model_without_logits_is_refused_naming_the_shape(tmp_path: Path) -> None:
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(IN_FEATURES, CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x.to(self.lin.weight.dtype)).flatten()

    class NoLogits(OwnModelRunDir):
        def load_model(self, which, dtype=torch.float32, device="cpu") -> nn.Module:
            return Flat().to(dtype)

    with pytest.raises(FathomError, match=r"logits shaped \[N, classes\]"):
        run_curvature(NoLogits(make_run(tmp_path)), [0], probe=4)


def test_cli_reports_missing_epochs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = make_run(tmp_path)
    rc = main(["curvature", str(run), "--epochs", "0", "100", "--probe", "4"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "fathom curvature: error" in err and "saved epochs [0, 1, 5]" in err


def test_cli_refuses_a_non_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["curvature", str(tmp_path), "--epochs", "0"]) == 2
    assert "not a run directory" in capsys.readouterr().err
