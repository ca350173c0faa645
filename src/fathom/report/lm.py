"""The language model in ``fathom report``: its curves, its layer-removal audit and its
depth-scaling verdict, as a ``summary.md`` section and two figures. Numbers are read from the
run directories, ``audit/audit.json`` (:mod:`fathom.audit.lm`) and a language-model
benchmark's ``table.json`` (:mod:`fathom.depthscale.lm_verdict`); nothing is recomputed.

Units: nats per token (``{split}/ce`` of a language-model run), perplexity ``exp`` of it
(``{split}/ppl``), FLOPs of a reduced network as a fraction of the full one (×).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fathom.base.units import fmt_value
from fathom.report.runs import RunData

SPLITS = ("fit", "val", "test")


def is_language_model(run: RunData) -> bool:
    """A run whose model kind scores tokens (its row in :mod:`fathom.config.model_kinds`)."""
    from fathom.config.model_kinds import MODEL_KINDS

    kind = (run.config.get("model") or {}).get("kind")
    row = MODEL_KINDS.get(kind) if isinstance(kind, str) else None
    return bool(row is not None and row.tokens)


def is_lm_audit(audit: Mapping[str, Any] | None) -> bool:
    return bool(audit) and audit.get("model") == "language model"  # type: ignore[union-attr]


def _nats(x: Any) -> str:
    return fmt_value(x, "nats", suffix=False)


def curve_lines(run: RunData) -> list[str]:
    """One run's table: per observed epoch, nats/token and perplexity of each split."""
    info = (run.manifest.get("data") or {}).get("info") or {}
    base = info.get("unigram_val_ce")
    lines = [
        f"### `{run.run_id}`: nats per token and perplexity by epoch",
        "",
        f"Unigram baseline (byte frequencies alone) on validation: {_nats(base)} nats/token, "
        f"perplexity {fmt_value(info.get('unigram_val_ppl'), '')}.",
        "",
        "| epoch | " + " | ".join(f"{s} nats/token | {s} ppl" for s in SPLITS) + " |",
        "|---:|" + "---:|---:|" * len(SPLITS),
    ]
    for row in run.rows:
        cells = [
            f"{_nats(row.get(f'{s}/ce'))} | {fmt_value(row.get(f'{s}/ppl'), '')}" for s in SPLITS
        ]
        lines.append(f"| {row.get('epoch')} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def audit_lines(audit: Mapping[str, Any]) -> list[str]:
    """The audit's computed sentences and its greedy path, per run and checkpoint."""
    lines = ["### Layer-removal audit", ""]
    for run in audit.get("runs", []):
        for which, rec in run.get("checkpoints", {}).items():
            if "missing" in rec:
                continue
            lines += [
                f"`{run['run_id']}`, {which} checkpoint (epoch {rec['epoch']}): "
                f"{rec['coverage']['text']}.",
                "",
                *(f"- {s}" for s in rec["sentences"]),
                "",
                "| greedy step | block removed | kept | test nats/token | test ppl | FLOPs of full (×) |",
                "|---:|---:|---|---:|---:|---:|",
            ]
            by_mask = {m["mask"]: m for m in rec["masks"]}
            for p in rec["greedy"]:
                m = by_mask[p["mask"]]
                lines.append(
                    f"| {p['step']} | {p['removed']} | `{p['mask']}` | {_nats(m['test']['ce'])} | "
                    f"{fmt_value(m['test']['ppl'], '')} | {fmt_value(m['flops_fraction'], '×')} |"
                )
            lines.append("")
    return lines


def scaling_lines(root: Path) -> list[str]:
    """A language-model benchmark's verdict (its ``table.json``), when ``root`` is one."""
    path = root / "table.json"
    if not path.exists():
        return []
    try:
        table = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return []
    if not isinstance(table, dict) or table.get("kind") != "lm_depth_scaling":
        return []
    v = table["verdict"]
    return [
        "### Depth scaling: LayerDrop vs dense",
        "",
        f"Metric: {table['metric']}. **Level:** {v['level']}. **Scaling:** {v['trend']}.",
        "",
        *(f"- {line}" for line in v["lines"]),
        "",
    ]


def lm_section(runs: Sequence[RunData], audit: Mapping[str, Any] | None, root: Path) -> list[str]:
    """The ``## Language model`` section of ``summary.md`` (empty without a language model)."""
    lms = [r for r in runs if is_language_model(r)]
    if not lms:
        return []
    lines = ["## Language model", ""]
    for r in lms:
        lines += curve_lines(r)
    if is_lm_audit(audit):
        lines += audit_lines(audit)  # type: ignore[arg-type]
    return lines + scaling_lines(root)


def lm_figures(runs: Sequence[RunData], audit: Mapping[str, Any] | None, out: Path) -> list[Path]:
    """``lm_curves.png`` (nats/token by epoch, val and test, per run) and, with an audit,
    ``lm_removal.png`` (test nats/token against the FLOPs fraction of every mask)."""
    from fathom.report.figures import _pyplot

    lms = [r for r in runs if is_language_model(r)]
    if not lms:
        return []
    plt = _pyplot()
    made = []
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in lms:
        for split, style in (("val", "-"), ("test", "--")):
            pts = [
                (row["epoch"], row[f"{split}/ce"])
                for row in r.rows
                if row.get(f"{split}/ce") is not None
            ]
            if pts:
                ax.plot(*zip(*pts), style, marker=".", label=f"{r.run_id} {split}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("nats per token")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "lm_curves.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    made.append(out / "lm_curves.png")
    if is_lm_audit(audit):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for run in audit["runs"]:  # type: ignore[index]
            for which, rec in run["checkpoints"].items():
                if "missing" in rec:
                    continue
                xs = [m["flops_fraction"] for m in rec["masks"]]
                ys = [m["test"]["ce"] for m in rec["masks"]]
                ax.scatter(xs, ys, s=14, label=f"{run['run_id']} {which}")
        ax.set_xlabel("FLOPs of the full network (×)")
        ax.set_ylabel("test nats per token")
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize=8)
        fig.savefig(out / "lm_removal.png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        made.append(out / "lm_removal.png")
    return made
