"""CIFAR python-version archives: a tiny archive in the official format, checksums, bad input."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from fathom.data import DATASETS, CifarDataset, load_raw
from fathom.data.cifar import read_cifar_archive
from fathom.data.sources import resolve_archive
from fathom.errors import FathomError


def batch_bytes(data: np.ndarray, labels: list[int], label_key: str) -> bytes:
    return pickle.dumps(
        {b"batch_label": b"x", b"data": data, label_key.encode(): labels}, protocol=2
    )


def write_archive(path: Path, spec: CifarDataset, seed: int = 0, per_batch: int = 3) -> dict:
    """An archive laid out like the official one, with ``per_batch`` images per member."""
    rng = np.random.default_rng(seed)
    members = {}
    for member in spec.train_members + spec.test_members:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, spec.classes, per_batch).tolist()
        members[member] = (data, labels)
    with tarfile.open(path, "w:gz") as tar:
        for member, (data, labels) in members.items():
            blob = batch_bytes(data, labels, spec.label_key)
            info = tarfile.TarInfo(member)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return members


def checksummed(spec: CifarDataset, path: Path, per_batch: int = 3) -> CifarDataset:
    """The spec with the tiny archive's own checksums (the real table is left untouched)."""
    data = path.read_bytes()
    return replace(
        spec,
        md5=hashlib.md5(data).hexdigest(),
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        train_size=per_batch * len(spec.train_members),
        test_size=per_batch * len(spec.test_members),
    )


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("FATHOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FATHOM_DATA", raising=False)
    return tmp_path


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_tiny_archive_round_trip(env, monkeypatch, name):
    real = DATASETS[name]
    path = env / real.archive
    members = write_archive(path, real)
    spec = checksummed(real, path)
    monkeypatch.setitem(DATASETS, name, spec)
    raw = load_raw(name, env)
    assert raw.source == "path" and raw.files == {real.archive: spec.sha256}
    first_member = real.train_members[0]
    data, labels = members[first_member]
    assert raw.train_x.dtype == torch.uint8 and raw.train_x.shape == (spec.train_size, 3, 32, 32)
    # channel-major layout: the first 1024 values are the red plane, row-major
    assert torch.equal(raw.train_x[0, 0], torch.from_numpy(data[0, :1024].reshape(32, 32)))
    assert torch.equal(raw.train_x[0, 2, 31], torch.from_numpy(data[0, -32:]))
    assert raw.train_y[:3].tolist() == labels and raw.train_y.dtype == torch.int64
    test_data, test_labels = members[real.test_members[0]]
    assert torch.equal(raw.test_x.reshape(-1, 3072), torch.from_numpy(test_data))
    assert raw.test_y.tolist() == test_labels
    assert raw.classes == real.classes


def test_cifar100_uses_fine_labels(env):
    spec = DATASETS["cifar100"]
    path = env / spec.archive
    with tarfile.open(path, "w:gz") as tar:
        for member in spec.train_members + spec.test_members:
            blob = pickle.dumps(
                {
                    b"data": np.zeros((2, 3072), np.uint8),
                    b"fine_labels": [57, 99],
                    b"coarse_labels": [3, 19],
                },
                protocol=2,
            )
            info = tarfile.TarInfo(member)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    out = read_cifar_archive(path, checksummed(spec, path, per_batch=2))
    assert out["train_y"].tolist() == [57, 99]


def test_archive_path_may_be_given_directly_or_nested(env, monkeypatch):
    real = DATASETS["cifar10"]
    nested = env / "d" / "cifar10" / real.archive
    nested.parent.mkdir(parents=True)
    write_archive(nested, real)
    monkeypatch.setitem(DATASETS, "cifar10", checksummed(real, nested))
    assert load_raw("cifar10", env / "d").train_x.shape[0] == 15
    assert load_raw("cifar10", nested).source == "path"


def test_missing_archive_says_where_to_put_it(env):
    with pytest.raises(FathomError) as e:
        load_raw("cifar100", env / "nowhere")
    msg = str(e.value)
    assert "cifar-100-python.tar.gz not found" in msg
    assert str(env / "nowhere" / "cifar-100-python.tar.gz") in msg
    assert DATASETS["cifar100"].url in msg


def test_wrong_checksum_is_rejected_against_the_real_table(env):
    path = env / "cifar-10-python.tar.gz"
    write_archive(path, DATASETS["cifar10"])
    with pytest.raises(FathomError) as e:
        load_raw("cifar10", env)
    msg = str(e.value)
    assert str(path) in msg and "c58f30108f718f92721af3b95e74349a" in msg
    assert hashlib.md5(path.read_bytes()).hexdigest() in msg and "put it at" in msg


def test_one_flipped_byte_fails_the_check(env):
    real = DATASETS["cifar10"]
    path = env / real.archive
    write_archive(path, real)
    spec = checksummed(real, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(FathomError, match="corrupt or wrong archive"):
        resolve_archive(spec, env)


def test_real_checksums_are_the_published_ones():
    assert DATASETS["cifar10"].md5 == "c58f30108f718f92721af3b95e74349a"
    assert DATASETS["cifar100"].md5 == "eb9058c3a382ffc7106e4002c42a8d85"
    assert DATASETS["cifar100"].label_key == "fine_labels"


def test_pickle_with_foreign_globals_is_refused(env):
    real = DATASETS["cifar10"]
    path = env / real.archive

    class Evil:
        def __reduce__(self):
            return (os.getcwd, ())

    with tarfile.open(path, "w:gz") as tar:
        blob = pickle.dumps({b"data": Evil(), b"labels": [0]}, protocol=2)
        for member in real.train_members + real.test_members:
            info = tarfile.TarInfo(member)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    with pytest.raises(FathomError, match="is not allowed in a CIFAR batch"):
        read_cifar_archive(path, checksummed(real, path))


def test_archive_without_the_expected_members_is_rejected(env):
    real = DATASETS["cifar10"]
    path = env / real.archive
    write_archive(path, replace(real, train_members=("other/data_batch_1",)))
    with pytest.raises(FathomError, match="member cifar-10-batches-py/data_batch_1 missing"):
        read_cifar_archive(path, checksummed(real, path))


def test_fetch_copies_the_verified_archive_into_the_cache(env, monkeypatch):
    from fathom.data.cli import fetch

    real = DATASETS["cifar10"]
    path = env / "downloads" / real.archive
    path.parent.mkdir()
    write_archive(path, real)
    monkeypatch.setitem(DATASETS, "cifar10", checksummed(real, path))
    rows = fetch("cifar10", str(path))
    cached = env / "cache" / "cifar10" / real.archive
    assert rows[0]["path"] == str(cached) and cached.read_bytes() == path.read_bytes()
    assert load_raw("cifar10").source == "cache"
