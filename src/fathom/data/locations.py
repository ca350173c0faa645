"""The local places a dataset's files may be in: an explicit path, the cache, an OS package.

Each is a :class:`LocalDir` with the fix to suggest when a file found there is corrupt
(the order and the rules are in :mod:`fathom.data.sources`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fathom.data.registry import CifarDataset, IdxDataset, IdxFile, TextDataset
from fathom.errors import FathomError


def cache_root() -> Path:
    """``$FATHOM_CACHE``, else ``$XDG_CACHE_HOME/fathom``, else ``~/.cache/fathom``."""
    if env := os.environ.get("FATHOM_CACHE"):
        return Path(env).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "fathom"
    return Path.home() / ".cache" / "fathom"


def explicit_root(data_dir: str | os.PathLike | None) -> Path | None:
    """The explicit data directory: the argument, else ``$FATHOM_DATA``, else None. A
    ``$FATHOM_DATA`` that names no directory is refused, never passed over for the cache: the
    user meant it to be read first."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    if env := os.environ.get("FATHOM_DATA"):
        root = Path(env).expanduser()
        if not root.is_dir():
            what = "is not a directory" if root.exists() else "does not exist"
            raise FathomError(
                f"FATHOM_DATA={env!r} {what}: it names the directory read before the cache; "
                "point it at an existing directory, or unset it to use the cache"
            )
        return root
    return None


@dataclass(frozen=True)
class LocalDir:
    """A directory that may hold a dataset's files, either directly or under ``<dataset>/``."""

    label: str
    root: Path
    fix: str  # how to repair a corrupt file found here; ``{path}`` is substituted
    nested: bool = True  # look in ``root/<dataset>/``
    flat: bool = False  # look in ``root/`` itself


def local_dirs(
    spec: IdxDataset | CifarDataset | TextDataset, data_dir: str | os.PathLike | None
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
