"""The audit in the report: headline sentences and tables, and the mask and example explorer data.

Headline: the computed paired-damage sentences of ``audit.json``'s aggregate (per checkpoint),
a table per arm, checkpoint and number of kept branches (test accuracy in %, damage ΔCE in
nats, both with their 95% t intervals over seeds), and the single-branch deletions.

Explorer data (``mask_payload``): every mask of every audited (run, checkpoint) with kept
branches, MAC fraction, accuracy, CE and damage; and for the first audited seed of each arm,
a fixed set of test examples with the logits of every mask, read from the audit's ``.npz``.
Examples are chosen once across those runs: those some masks classify correctly and others
not (spread over how many masks keep them correct), then a few every mask gets right and a
few every mask gets wrong. Images come from the dataset cache when the run's test split is
the first ``eval_subset`` official test images and the labels agree; otherwise none.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fathom.errors import FathomError
from fathom.report.tables import esc, headline_table
from fathom.stats.units import percent

MAX_EXAMPLES = 48


def _iv(
    iv: Mapping[str, Any] | None, convert: Callable[[float], Any] = float, fmt: str = ".4f"
) -> str:
    """``estimate [low, high]`` after ``convert`` (``percent`` for accuracy)."""
    if not iv:
        return "—"
    text = format(convert(iv["estimate"]), fmt)
    if iv.get("low") is None:
        return f"{text} (n={iv['n']})"
    return f"{text} [{format(convert(iv['low']), fmt)}, {format(convert(iv['high']), fmt)}]"


def damage_sentences(agg: Mapping[str, Any]) -> list[str]:
    """One sentence per (arm, checkpoint) from the audit's computed paired-damage verdicts:
    ``sd_constant vs residual, selected checkpoint, damage ΔCE by kept branches: 0 of 4
    better (−0.4527 nats [−0.5229, −0.3824]), ...``."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for which, a in agg.items():
        for p in a.get("paired_damage") or []:
            groups.setdefault((p["arm"], p["reference"], which), []).append(p)
    out = []
    for (arm, ref, which), ps in sorted(groups.items()):
        k = next((a["k"] for a in [(agg[which].get("arms") or {}).get(arm) or {}] if "k" in a), "?")
        parts = []
        for p in sorted(ps, key=lambda p: int(p["kept"])):
            v = p.get("verdict") or {}
            d = v.get("diff") or {}
            if d.get("estimate") is None:
                parts.append(f"{p['kept']} of {k} kept: {v.get('verdict', 'no comparison')}")
                continue
            iv = f" [{d['low']:+.4f}, {d['high']:+.4f}]" if d.get("low") is not None else ""
            parts.append(f"{p['kept']} of {k} kept {v['verdict']} ({d['estimate']:+.4f} nats{iv})")
        out.append(
            f"{arm} vs {ref}, {which} checkpoint, test damage ΔCE: " + "; ".join(parts) + "."
        )
    return out


def audit_headline(audit: Mapping[str, Any]) -> str:
    agg = audit.get("aggregate") or {}
    sentences = damage_sentences(agg)
    full = [
        f"{w} checkpoint: {p['sentence']}"
        for w, a in agg.items()
        for p in a.get("paired_damage") or []
    ]
    out = [
        "<ul class='verdicts' id='audit-verdicts'>"
        + "".join(f"<li>{esc(s)}</li>" for s in sentences)
        + "</ul>",
        "<details><summary>every damage comparison as a full sentence</summary><ul>"
        + "".join(f"<li>{esc(s)}</li>" for s in full)
        + "</ul></details>",
    ]
    sizes = sorted(
        {
            int(k)
            for a in agg.values()
            for s in (a.get("arms") or {}).values()
            for k in s.get("by_size") or {}
        },
        reverse=True,
    )
    for key, caption, convert, fmt in (
        (
            "test_damage",
            "Damage ΔCE (nats) [95% CI], mean over the masks keeping that many branches",
            float,
            "+.4f",
        ),
        (
            "test_acc",
            "Test accuracy (%) [95% CI], mean over the masks keeping that many branches",
            percent,
            ".2f",
        ),
    ):
        rows = []
        for which, a in agg.items():
            for arm, s in (a.get("arms") or {}).items():
                by = s.get("by_size") or {}
                rows.append(
                    [
                        arm,
                        which,
                        *(
                            _iv(by[str(k)][key], convert, fmt) if str(k) in by else "—"
                            for k in sizes
                        ),
                    ]
                )
        if rows:
            tid = "audit-table" if key == "test_damage" else "audit-acc-table"
            out.append(
                headline_table(
                    tid, caption, ["arm", "checkpoint", *(f"{k} kept" for k in sizes)], rows, 2
                )
            )
    branch_rows = []
    for which, a in agg.items():
        for arm, s in (a.get("arms") or {}).items():
            for br in s.get("branches") or []:
                branch_rows.append(
                    [arm, which, str(br["branch"]), f"{br['branch_macs_fraction']:.3f}",
                     _iv(br["test_acc"], percent, ".2f"), _iv(br["test_damage"], float, "+.4f")]
                )  # fmt: skip
    if branch_rows:
        out.append(
            "<details><summary>single-branch deletions (one row per arm, checkpoint and branch)</summary>"
            + headline_table(
                "branch-table",
                "Removing one branch",
                [
                    "arm",
                    "checkpoint",
                    "branch removed",
                    "MAC fraction of dense",
                    "test acc (%) [95% CI]",
                    "damage ΔCE (nats) [95% CI]",
                ],
                branch_rows,
                2,
            )
            + "</details>"
        )
    out.append(
        "<p class='note'>Damage is the increase of test CE over the same model's full output (nats); "
        "intervals are 95% Student-t over seeds, descriptive and uncorrected. Kept branches run at "
        "gain one; removed branches are not computed.</p>"
    )
    return "\n".join(out)


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


def _choose(correct_sets: list[np.ndarray], n_max: int) -> list[int]:
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
    data = (run.config.get("data") if run is not None else None) or {}
    name = data.get("dataset")
    try:
        from fathom.data.load import load_raw

        raw = load_raw(str(name), download=False)
    except (FathomError, OSError, ValueError) as e:  # no images; the page says why
        return [None] * len(
            idx
        ), f"images unavailable ({name!r} not loadable from the cache: {type(e).__name__})"
    ty = raw.test_y.numpy()
    if any(int(ty[i]) != int(labels[i]) for i in idx):
        return [None] * len(
            idx
        ), "images unavailable (the audit's test labels do not match the cached test set order)"
    x = raw.test_x.numpy()
    if x.ndim != 3:
        return [None] * len(idx), "images unavailable (not single-channel images)"
    return [
        base64.b64encode(np.ascontiguousarray(x[i], dtype=np.uint8).tobytes()).decode() for i in idx
    ], f"{name} test images, first-{len(ty)} order"


def mask_payload(
    audit: Mapping[str, Any], audit_dir: Path, runs_by_id: Mapping[str, Any]
) -> dict[str, Any]:
    tables, first_seed = [], {}
    for run in audit.get("runs") or []:
        for which, rec in (run.get("checkpoints") or {}).items():
            if not isinstance(rec, Mapping) or not _mask_rows(rec) or "run_id" not in run:
                continue
            key = f"{run['run_id']}|{which}"
            tables.append(
                {
                    "key": key,
                    "run": run["run_id"],
                    "arm": run.get("arm", run.get("recipe", "?")),
                    "seed": run.get("seed"),
                    "checkpoint": which,
                    "epoch": rec.get("epoch"),
                    "masks": _mask_rows(rec),
                }
            )
            first_seed.setdefault(tables[-1]["arm"], run["run_id"])
    chosen = [t for t in tables if first_seed.get(t["arm"]) == t["run"]]
    arrays = {}
    for t in chosen:
        p = audit_dir / t["run"] / f"{t['checkpoint']}.npz"
        if p.exists():
            with np.load(p) as z:
                arrays[t["key"]] = {
                    k: z[f"test/{k}"] for k in ("masks", "labels", "logits", "correct")
                }
    examples: dict[str, Any] = {
        "indices": [],
        "labels": [],
        "images": [],
        "per": {},
        "note": "no per-example arrays found",
    }
    if arrays:
        first = next(iter(arrays.values()))
        idx = _choose([a["correct"] for a in arrays.values()], MAX_EXAMPLES)
        images, note = _images(runs_by_id.get(chosen[0]["run"]), first["labels"], idx)
        examples = {
            "indices": idx,
            "labels": [int(first["labels"][i]) for i in idx],
            "images": images,
            "note": note,
            "per": {
                k: {
                    "masks": ["".join(str(int(b)) for b in m) for m in a["masks"]],
                    "logits": np.round(a["logits"][:, idx, :].astype(float), 3).tolist(),
                }
                for k, a in arrays.items()
            },
        }
    return {"tables": tables, "examples": examples}
