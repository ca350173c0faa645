"""Seeded splits: determinism, disjointness, subsets, fit-all, split hash, bad input."""

from __future__ import annotations

import pytest
import torch

from fathom.data import RawDataset, make_splits
from fathom.errors import FathomError

N_TRAIN, N_TEST, VAL = 60, 20, 10


@pytest.fixture
def raw() -> RawDataset:
    # Image i carries its own index in pixel (0, 0), so membership can be read back.
    train_x = torch.zeros(N_TRAIN, 28, 28, dtype=torch.uint8)
    train_x[:, 0, 0] = torch.arange(N_TRAIN, dtype=torch.uint8)
    test_x = torch.zeros(N_TEST, 28, 28, dtype=torch.uint8)
    test_x[:, 0, 0] = torch.arange(N_TEST, dtype=torch.uint8)
    return RawDataset(
        name="tiny",
        classes=10,
        train_x=train_x,
        train_y=torch.arange(N_TRAIN) % 10,
        test_x=test_x,
        test_y=torch.arange(N_TEST) % 10,
        files={"f": "0" * 64},
        source="path",
    )


def ids(x: torch.Tensor) -> list[int]:
    return x[:, 0, 0].tolist()


def test_same_seed_same_split_and_hash(raw):
    a = make_splits(raw, seed=3, val_size=VAL)
    b = make_splits(raw, seed=3, val_size=VAL)
    assert a.split_hash == b.split_hash
    for name in ("fit_x", "fit_y", "val_x", "val_y", "test_x", "test_y"):
        assert torch.equal(getattr(a, name), getattr(b, name))


def test_different_seed_changes_split_and_hash(raw):
    a = make_splits(raw, seed=0, val_size=VAL)
    b = make_splits(raw, seed=1, val_size=VAL)
    assert a.split_hash != b.split_hash
    assert ids(a.val_x) != ids(b.val_x)


def test_fit_and_val_partition_the_training_set(raw):
    s = make_splits(raw, seed=0, val_size=VAL)
    fit, val = ids(s.fit_x), ids(s.val_x)
    assert len(fit) == N_TRAIN - VAL and len(val) == VAL
    assert not set(fit) & set(val)
    assert sorted(fit + val) == list(range(N_TRAIN))
    perm = torch.randperm(N_TRAIN, generator=torch.Generator().manual_seed(0)).tolist()
    assert fit == perm[: N_TRAIN - VAL] and val == perm[N_TRAIN - VAL :]
    assert torch.equal(s.fit_y, raw.train_y[s.fit_x[:, 0, 0].long()])
    assert ids(s.test_x) == list(range(N_TEST))
    assert s.info["sizes"] == {"fit": N_TRAIN - VAL, "val": VAL, "test": N_TEST}
    assert s.fit_x.dtype == torch.uint8 and s.fit_y.dtype == torch.int64


def test_default_val_size_is_ten_thousand():
    raw = RawDataset(
        name="big",
        classes=10,
        train_x=torch.zeros(60_000, 1, dtype=torch.uint8),
        train_y=torch.zeros(60_000, dtype=torch.int64),
        test_x=torch.zeros(3, 1, dtype=torch.uint8),
        test_y=torch.zeros(3, dtype=torch.int64),
        files={},
        source="path",
    )
    s = make_splits(raw)
    assert s.info["sizes"] == {"fit": 50_000, "val": 10_000, "test": 3}


def test_subsets_take_the_first_examples(raw):
    full = make_splits(raw, seed=2, val_size=VAL)
    sub = make_splits(raw, seed=2, val_size=VAL, fit_subset=7, eval_subset=4)
    assert ids(sub.fit_x) == ids(full.fit_x)[:7]
    assert ids(sub.val_x) == ids(full.val_x)[:4]
    assert ids(sub.test_x) == list(range(4))
    assert sub.info["subsets"] == {"fit": 7, "eval": 4}
    assert sub.info["sizes"] == {"fit": 7, "val": 4, "test": 4}
    assert sub.split_hash != full.split_hash


def test_fit_all_uses_every_training_example_and_has_no_validation(raw):
    s = make_splits(raw, mode="fit-all", seed=0)
    assert sorted(ids(s.fit_x)) == list(range(N_TRAIN))
    assert s.val_x.shape == (0, 28, 28) and s.val_y.shape == (0,)
    assert s.info["sizes"]["val"] == 0
    assert s.info["validation"] is None and "no validation" in s.info["note"]
    assert s.split_hash != make_splits(raw, seed=0, val_size=VAL).split_hash
    t = make_splits(raw, mode="fit-all", eval_subset=N_TEST)
    assert t.test_x.shape[0] == N_TEST


def test_split_hash_covers_the_permutation(raw, monkeypatch):
    import fathom.data.splits as splits

    a = make_splits(raw, seed=0, val_size=VAL).split_hash
    real = splits.split_permutation
    monkeypatch.setattr(splits, "split_permutation", lambda n, seed: real(n, seed).flip(0))
    assert make_splits(raw, seed=0, val_size=VAL).split_hash != a


def test_tensors_move_to_device(raw):
    s = make_splits(raw, val_size=VAL, device=torch.device("meta"))
    assert s.fit_x.device.type == "meta" and s.test_y.device.type == "meta"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "fit-test"}, "unknown split mode 'fit-test'"),
        ({"seed": -1}, "non-negative integer"),
        ({"seed": 1.5}, "non-negative integer"),
        ({"fit_subset": 0}, "positive integer"),
        ({"fit_subset": N_TRAIN}, f"exceeds the {N_TRAIN - VAL} fitting"),
        ({"eval_subset": VAL + 1}, f"exceeds the {VAL} validation/test"),
        ({"val_size": N_TRAIN}, "val_size must be an integer in"),
        ({"val_size": 0}, "val_size must be an integer in"),
    ],
)
def test_bad_split_arguments(raw, kwargs, message):
    kwargs = {"val_size": VAL, **kwargs}
    with pytest.raises(FathomError, match=message):
        make_splits(raw, **kwargs)
