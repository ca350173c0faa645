"""The mask and example explorer's data: every mask of every audited (run, checkpoint), and
test examples under each mask for every audited seed of every arm.

Masks (``tables``): kept branches, MAC fraction, accuracy, CE and damage, from ``audit.json``.

Examples (``examples``): one fixed set of test examples, chosen once across every audited
(run, checkpoint) whose ``.npz`` holds per-example arrays on the same test labels: those
some masks classify correctly and others not (spread over how many masks keep them
correct), then up to 4 every mask gets right and up to 4 every mask gets wrong. Per
(run, checkpoint): the logits of every mask on those examples, rounded to 3 decimals.

Page-size budget: the examples' logits (every mask of every audited seed, as JSON) are
kept within :data:`EXAMPLE_BUDGET_BYTES`; the images (784 bytes each, base64) and labels
of at most :data:`MAX_EXAMPLES` examples come on top. With ``K`` audited
(run, checkpoint) pairs of ``M`` masks over ``C`` classes the logits take about
``K · M · C · 7`` bytes per example, so the example count is the largest ``n <=``
:data:`MAX_EXAMPLES` that fits (never below :data:`MIN_EXAMPLES`; if even that does not
fit, the last pairs keep their mask tables only and the note says which). Images come from
the dataset cache when the runs' test split is the first ``eval_subset`` official test
images and the labels agree; otherwise none.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fathom.base.units import percent
from fathom.errors import FathomError

MAX_EXAMPLES = 48
MIN_EXAMPLES = 12
EXAMPLE_BUDGET_BYTES = 1_500_000
"""Most bytes the explorer's examples add to report.html (1.5 MB: the page stays one file
that opens in about a second; the curves' data are the rest)."""


def _mask_rows(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "mask": m["mask"],
            "kept": m["kept"],
            "macs_fraction": m.get("macs_fraction"),
            "test_acc": percent(m["test"]["acc"]),
            "test_ce": m["test"]["ce"],
            "test_damage": m["test"]["damage"],
            "val_acc": percent(m["val"]["acc"]),
            "val_damage": m["val"]["damage"],
        }
        for m in rec.get("masks") or []
        if isinstance(m, Mapping) and "mask" in m and "test" in m and "val" in m
    ]


def choose_examples(correct_sets: list[np.ndarray], n_max: int) -> list[int]:
    """Test-example indices: up to ``n_max - 8`` of those kept correct by some masks but
    not all (evenly over how many masks keep them), up to 4 always right, 4 always wrong.
    ``correct_sets[k]``: ``[masks, N]`` booleans of one (run, checkpoint)."""
    counts = sum(c.sum(axis=0) for c in correct_sets)  # [N]: masks keeping each example right
    total = sum(c.shape[0] for c in correct_sets)
    mixed = np.flatnonzero((counts > 0) & (counts < total))
    mixed = mixed[np.argsort(counts[mixed], kind="stable")]
    take = (
        mixed[np.linspace(0, len(mixed) - 1, min(len(mixed), n_max - 8)).round().astype(int)]
        if len(mixed)
        else mixed
    )
    right = np.flatnonzero(counts == total)[:4]
    wrong = np.flatnonzero(counts == 0)[:4]
    return sorted({int(i) for i in (*take, *right, *wrong)})


def _images(run: Any, labels: np.ndarray, idx: list[int]) -> tuple[list[str | None], str]:
    name = run.recorded.config.data.dataset if run is not None else None
    none: list[str | None] = [None] * len(idx)
    try:
        from fathom.data.load import load_raw

        raw = load_raw(str(name), download=False)
    except (FathomError, OSError, ValueError) as e:  # no images; the page says why
        return (
            none,
            f"images unavailable ({name!r} not loadable from the cache: {type(e).__name__})",
        )
    ty = raw.test_y.numpy()
    if any(int(ty[i]) != int(labels[i]) for i in idx):
        return (
            none,
            "images unavailable (the audit's test labels do not match the cached test set order)",
        )
    x = raw.test_x.numpy()
    if x.ndim != 3:
        return none, "images unavailable (not single-channel images)"
    return [
        base64.b64encode(np.ascontiguousarray(x[i], dtype=np.uint8).tobytes()).decode() for i in idx
    ], f"{name} test images, first-{len(ty)} order"


def _mask_tables(audit: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per audited (run, checkpoint) with its masks (see the module docstring)."""
    tables = []
    for run in audit.get("runs") or []:
        for which, rec in (run.get("checkpoints") or {}).items():
            if not isinstance(rec, Mapping) or not _mask_rows(rec) or "run_id" not in run:
                continue
            tables.append(
                {
                    "key": f"{run['run_id']}|{which}",
                    "run": run["run_id"],
                    "arm": run.get("arm", run.get("recipe", "?")),
                    "seed": run.get("seed"),
                    "checkpoint": which,
                    "epoch": rec.get("epoch"),
                    "masks": _mask_rows(rec),
                }
            )
    return tables


def _arrays(tables: list[dict[str, Any]], audit_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """Per-example test arrays per key, those on the first one's labels; keys left out."""
    arrays: dict[str, Any] = {}
    other: list[str] = []
    for t in tables:
        p = audit_dir / t["run"] / f"{t['checkpoint']}.npz"
        if not p.exists():
            continue
        with np.load(p, allow_pickle=False) as z:
            a = {k: z[f"test/{k}"] for k in ("masks", "labels", "logits", "correct")}
        first = next(iter(arrays.values()), a)
        if a["labels"].shape != first["labels"].shape or (a["labels"] != first["labels"]).any():
            other.append(t["key"])
            continue
        arrays[t["key"]] = a
    return arrays, other


def _per(arrays: Mapping[str, Any], idx: list[int]) -> dict[str, Any]:
    return {
        k: {
            "masks": ["".join(str(int(b)) for b in m) for m in a["masks"]],
            "logits": np.round(a["logits"][:, idx, :].astype(float), 3).tolist(),
        }
        for k, a in arrays.items()
    }


def _size(per: Mapping[str, Any]) -> int:
    """Bytes of ``per`` in the page (compact JSON, as embedded)."""
    return len(json.dumps(per, separators=(",", ":")))


def _fit(arrays: dict[str, Any], budget: int) -> tuple[list[int], dict[str, Any], list[str]]:
    """The largest example set (and the keys kept) whose logits fit ``budget`` bytes."""
    correct = [a["correct"] for a in arrays.values()]
    idx = choose_examples(correct, MAX_EXAMPLES)
    per = _per(arrays, idx)
    size, n = _size(per), len(idx)
    while size > budget and n > MIN_EXAMPLES:  # the size is about proportional to n
        n = max(MIN_EXAMPLES, min(n - 1, int(n * budget / size)))
        idx = choose_examples(correct, n)
        per = _per(arrays, idx)
        size = _size(per)
    dropped: list[str] = []
    while per and _size(per) > budget:
        dropped.insert(0, list(per)[-1])
        per.pop(dropped[0])
    return idx, per, dropped


def mask_payload(
    audit: Mapping[str, Any],
    audit_dir: Path,
    runs_by_id: Mapping[str, Any],
    budget: int = EXAMPLE_BUDGET_BYTES,
) -> dict[str, Any]:
    """``{"tables", "examples"}`` for the explorer (see the module docstring)."""
    tables = _mask_tables(audit)
    arrays, other = _arrays(tables, audit_dir)
    examples: dict[str, Any] = {"indices": [], "labels": [], "images": [], "per": {}}
    examples["note"] = "no per-example arrays found"
    if arrays:
        first_key = next(iter(arrays))
        idx, per, dropped = _fit(arrays, budget)
        images, note = _images(
            runs_by_id.get(first_key.split("|")[0]), arrays[first_key]["labels"], idx
        )
        budget_note = (
            f"{len(idx)} examples for each of {len(per)} audited (run, checkpoint) pairs, within "
            f"the page budget of {budget / 1e6:g} MB for example data"
        )
        if dropped:
            budget_note += f"; over budget, mask tables only: {', '.join(dropped)}"
        if other:
            budget_note += f"; other test labels, mask tables only: {', '.join(other)}"
        examples = {
            "indices": idx,
            "labels": [int(arrays[first_key]["labels"][i]) for i in idx],
            "images": images,
            "note": f"{note}; {budget_note}",
            "per": per,
        }
    return {"tables": tables, "examples": examples}
