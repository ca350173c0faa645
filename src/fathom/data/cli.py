"""``fathom data fetch|verify|info [DATASET] [--data-dir DIR]``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from fathom.config.inputs import check_data_dir
from fathom.data.registry import DATASETS, CifarDataset, IdxDataset, TextDataset, dataset_spec
from fathom.errors import FathomError


def _idx_rows(spec: IdxDataset, resolved) -> list[dict]:
    """One row per verified IDX file: name, expected SHA-256, path and the source used."""
    return [
        {
            "file": f.name,
            "sha256": f.sha256,
            "path": str(resolved.paths[f.name]),
            "source": resolved.origins[f.name],
        }
        for f in spec.files
    ]


def fetch(name: str, data_dir: str | None) -> list[dict]:
    """Make a verified copy of every file of ``name`` available; one row per file.

    IDX datasets are downloaded into the cache when not found locally. A CIFAR archive
    is never downloaded: the verified archive from ``data_dir`` is copied into the cache.
    """
    from fathom.data.sources import cache_root, resolve_archive, resolve_idx

    spec = dataset_spec(name)
    if isinstance(spec, TextDataset):
        return _text_rows(spec, data_dir, download=True)
    if isinstance(spec, IdxDataset):
        resolved = resolve_idx(spec, data_dir, download=True)
        return _idx_rows(spec, resolved)
    path, source = resolve_archive(spec, data_dir)
    target = cache_root() / spec.name / spec.archive
    if path.resolve() != target.resolve():
        _copy_atomic(path, target)
    return [{"file": spec.archive, "sha256": spec.sha256, "path": str(target), "source": source}]


def _text_rows(spec: TextDataset, data_dir: str | None, download: bool) -> list[dict]:
    """The one verified file of a text corpus (fetched into the cache when ``download``)."""
    from fathom.data.text import resolve_text

    _, path, source = resolve_text(spec, data_dir, download=download)
    return [{"file": spec.file, "sha256": spec.sha256, "path": str(path), "source": source}]


def _copy_atomic(source: Path, target: Path) -> None:
    """Copy through a temporary file: Ctrl-C during the copy removes it, and is held back
    while ``mkstemp`` creates it (the name is not yet ours to remove)."""
    from fathom.base.interrupts import uninterrupted

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with uninterrupted():
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            os.close(fd)
        try:
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise FathomError(
            f"cannot copy {source} to {target}: {e.strerror or e}. "
            "Set FATHOM_CACHE to a writable directory."
        ) from None


def verify(name: str, data_dir: str | None) -> list[dict]:
    """Verify the local files of ``name`` (no download); raise on a missing or corrupt file."""
    from fathom.data.sources import resolve_archive, resolve_idx

    spec = dataset_spec(name)
    if isinstance(spec, TextDataset):
        return _text_rows(spec, data_dir, download=False)
    if isinstance(spec, IdxDataset):
        resolved = resolve_idx(spec, data_dir, download=False)
        return _idx_rows(spec, resolved)
    path, source = resolve_archive(spec, data_dir)
    return [{"file": spec.archive, "sha256": spec.sha256, "path": str(path), "source": source}]


def _text_info(spec: TextDataset, cache: Path) -> dict:
    """A text corpus's registry entry: file, size, tokens, splits, sources."""
    from fathom.base.units import fmt_percent
    from fathom.data.registry import TEXT_FRACTIONS as FRACTIONS
    from fathom.data.registry import TEXT_VOCAB as VOCAB

    return {
        "dataset": spec.name,
        "title": spec.title,
        "tokens": f"bytes of the UTF-8 text ({spec.size} tokens), vocabulary {VOCAB}",
        "splits": "fit / val / test contiguous by position, "
        + " / ".join(fmt_percent(f, digits=0) for f in FRACTIONS)
        + "; windows of data.context tokens",
        "license": spec.license,
        "cache": str(cache),
        "files": {spec.file: spec.sha256},
        "sources": [
            "--data-dir / FATHOM_DATA",
            f"cache {cache}",
            f"npm {spec.npm_package} ({spec.member})",
        ],
        "cached": (cache / spec.file).is_file(),
    }


def info(spec: IdxDataset | CifarDataset | TextDataset) -> dict:
    """What the registry knows about ``spec`` and where its cached copy would live."""
    from fathom.data.sources import cache_root

    cache = cache_root() / spec.name
    if isinstance(spec, TextDataset):
        return _text_info(spec, cache)
    row = {
        "dataset": spec.name,
        "title": spec.title,
        "classes": spec.classes,
        "train": spec.train_size,
        "test": spec.test_size,
        "image": "x".join(map(str, spec.image_shape)) + " uint8",
        "cache": str(cache),
    }
    if isinstance(spec, IdxDataset):
        row["files"] = {f.name: f.sha256 for f in spec.files}
        row["sources"] = ["--data-dir / FATHOM_DATA", f"cache {cache}"]
        row["sources"] += [f"os-package {spec.os_package}: {d}" for d in spec.os_dirs]
        row["sources"] += [f"mirror {m}" for m in spec.mirrors]
        row["sources"] += [f"npm {spec.npm_package}"] if spec.npm_package else []
        row["cached"] = all((cache / f.name).is_file() for f in spec.files)
    else:
        row["files"] = {spec.archive: spec.sha256}
        row["md5"] = spec.md5
        row["sources"] = [
            f"--data-dir / FATHOM_DATA (user-supplied archive from {spec.url})",
            f"cache {cache}",
        ]
        row["cached"] = (cache / spec.archive).is_file()
    return row


def files_table(title: str, rows: list[dict], wide: bool = False):
    """The verified files: name, SHA-256 (12 hex digits; all with ``wide``) and source.

    When every file lies in one directory it is named once, in the caption, so the table
    fits 80 columns; otherwise each row shows its path.
    """
    from fathom.base.terminal import short_hash, table

    if "sha256" not in rows[0]:
        return table(title, list(rows[0]), [list(r.values()) for r in rows])
    dirs = {str(Path(r["path"]).parent) for r in rows}
    one_dir = len(dirs) == 1
    columns = ["file", "sha256" if wide else "sha256 (first 12)", "source"]
    columns += [] if one_dir else ["path"]
    body = [
        [r["file"], short_hash(r["sha256"], wide), r["source"], *([] if one_dir else [r["path"]])]
        for r in rows
    ]
    caption = f"in {dirs.pop()}" if one_dir else None
    return table(title, columns, body, wrap=["source", "path"], caption=caption)


def _print_files(title: str, rows: list[dict], args: argparse.Namespace) -> None:
    """Rows as a table (``--wide``: full hashes) or, with ``--json``, as JSON."""
    if args.json:
        print(json.dumps({"title": title, "files": rows}, indent=2))
        return
    from fathom.base.terminal import console

    console(args.wide).print(files_table(title, rows, args.wide))


def _run_fetch(args: argparse.Namespace) -> int:
    check_data_dir(args.data_dir, "--data-dir", args.dataset)
    rows = fetch(args.dataset, args.data_dir)
    _print_files(f"{args.dataset}: verified (SHA-256) and available", rows, args)
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    from fathom.data.sources import MissingDataError

    check_data_dir(args.data_dir, "--data-dir", args.dataset or "DATASET")
    names = [args.dataset] if args.dataset else sorted(DATASETS)
    for name in names:
        try:
            rows = verify(name, args.data_dir)
        except MissingDataError:
            if args.dataset:
                raise
            _print_files(
                name, [{"status": "not present", "fix": f"fathom data fetch {name}"}], args
            )
            continue
        _print_files(f"{name}: every file verified", rows, args)
    return 0


def info_table(row: dict, wide: bool = False):
    """One dataset's registry entry as a two-column table; hashes shortened unless ``wide``."""
    from fathom.base.terminal import short_hash, table

    body = []
    for key, value in row.items():
        if isinstance(value, dict):
            value = "\n".join(f"{k}  {short_hash(v, wide)}" for k, v in value.items())
        elif isinstance(value, list):
            value = "\n".join(value)
        body.append([key, str(value)])
    return table(f"{row['title']} ({row['dataset']})", ["field", "value"], body, wrap=["value"])


def _run_info(args: argparse.Namespace) -> int:
    from fathom.base.terminal import console

    specs = (
        [dataset_spec(args.dataset)] if args.dataset else [DATASETS[n] for n in sorted(DATASETS)]
    )
    rows = [info(spec) for spec in specs]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    out = console(args.wide)
    for row in rows:
        out.print(info_table(row, args.wide))
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="fetch, verify and describe datasets")
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    for action, func, default, text in (
        ("fetch", _run_fetch, "mnist", "download (or copy) and verify a dataset into the cache"),
        ("verify", _run_verify, None, "verify local files against the SHA-256 table (no download)"),
        ("info", _run_info, None, "show the registry entry, sources and cache location"),
    ):
        p = sub.add_parser(action, help=text, description=text)
        p.add_argument(
            "dataset",
            nargs="?",
            default=default,
            metavar="DATASET",
            help=f"one of {', '.join(sorted(DATASETS))}"
            + (f" (default {default})" if default else " (default: all)"),
        )
        p.add_argument("--data-dir", default=None, help="directory (or CIFAR archive) to use first")
        p.add_argument("--wide", action="store_true", help="full SHA-256 hashes and paths")
        p.add_argument("--json", action="store_true", help="print every value as JSON")
        p.set_defaults(func=func)
