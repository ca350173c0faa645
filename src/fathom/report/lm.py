"""The language model in ``fathom report``: its curves, its layer-removal audit and its
depth-scaling verdict, as a ``summary.md`` section, two figures and the ``report.html``
section (:func:`lm_html`: the same numbers as tables, every mask's row included, and the two
figures embedded as images). Numbers are read from the
run directories, ``audit/audit.json`` (:mod:`fathom.audit.lm`) and a language-model
benchmark's ``table.json`` (:mod:`fathom.depthscale.lm_verdict`); nothing is recomputed.

Units: nats per token (``{split}/ce`` of a language-model run), perplexity ``exp`` of it
(``{split}/ppl``), FLOPs of a reduced network as a fraction of the full one (×).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fathom.base.units import fmt_value
from fathom.report.lazy import details
from fathom.report.runs import RunData
from fathom.report.tables import esc
from fathom.study.records import language_model_warnings

SPLITS = ("fit", "val", "test")


def is_language_model(run: RunData) -> bool:
    """A run whose model kind scores tokens (its row in :mod:`fathom.config.model_kinds`)."""
    from fathom.config.model_kinds import MODEL_KINDS

    kind = run.recorded.config.model.kind
    row = MODEL_KINDS.get(kind) if kind is not None else None
    return bool(row is not None and row.tokens)


def is_lm_audit(audit: Mapping[str, Any] | None) -> bool:
    return bool(audit) and audit.get("model") == "language model"  # type: ignore[union-attr]


def _nats(x: Any) -> str:
    return fmt_value(x, "nats", suffix=False)


def _curve_lines(run: RunData) -> list[str]:
    """One run's table: per observed epoch, nats/token and perplexity of each split."""
    info = run.recorded.data.info
    base = info.unigram_val_ce
    lines = [
        f"### `{run.run_id}`: nats per token and perplexity by epoch",
        "",
        f"Unigram baseline (byte frequencies alone) on validation: {_nats(base)} nats/token, "
        f"perplexity {fmt_value(info.unigram_val_ppl, '')}.",
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


def _audit_lines(audit: Mapping[str, Any]) -> list[str]:
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


def _scaling_table(root: Path) -> dict[str, Any] | None:
    """A language-model benchmark's ``table.json`` (:mod:`fathom.depthscale.lm_verdict`),
    when ``root`` is one; ``None`` otherwise (absent, unreadable or another kind)."""
    path = root / "table.json"
    if not path.exists():
        return None
    try:
        table = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(table, dict) or table.get("kind") != "lm_depth_scaling":
        return None
    return table


def _scaling_lines(root: Path) -> list[str]:
    """A language-model benchmark's verdict (its ``table.json``), when ``root`` is one."""
    table = _scaling_table(root)
    if table is None:
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
        lines += _curve_lines(r)
    if is_lm_audit(audit):
        lines += _audit_lines(audit)  # type: ignore[arg-type]
    return lines + _scaling_lines(root)


def lm_figures(runs: Sequence[RunData], audit: Mapping[str, Any] | None, out: Path) -> list[Path]:
    """``lm_curves.png`` (nats/token by epoch, val and test, per run) and, with an audit,
    ``lm_removal.png`` (test nats/token against the FLOPs fraction of every mask)."""
    from fathom.report.figures import pyplot

    lms = [r for r in runs if is_language_model(r)]
    if not lms:
        return []
    plt = pyplot()
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


# ---------------------------------------------------------------- report.html


def _table(table_id: str, caption: str, head: Sequence[str], rows: Sequence[Sequence[str]],
           numeric: Sequence[bool]) -> str:  # fmt: skip
    """A plain HTML table; ``numeric[j]`` right-aligns column ``j`` (cells already text)."""
    cls = ["num" if n else "" for n in numeric]
    th = "".join(f'<th class="{c}">{esc(h)}</th>' for c, h in zip(cls, head, strict=True))
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{c}">{esc(x)}</td>' for c, x in zip(cls, r, strict=True))
        + "</tr>"
        for r in rows
    )
    return (
        f'<table class="headline" id="{esc(table_id)}"><caption>{esc(caption)}</caption>'
        f"<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
    )


def _baseline_text(run: RunData) -> str:
    """The run's last validation nats/token and perplexity beside the unigram baseline's
    (byte frequencies alone), numbers only; with the study's warning when the model did
    not get below it (:func:`fathom.study.records.language_model_warnings`)."""
    info = run.recorded.data.info
    base = info.unigram_val_ce
    last = next((r for r in reversed(run.rows) if r.get("val/ce") is not None), {})
    ce = last.get("val/ce")
    text = (
        f"Epoch {last.get('epoch', '—')}: validation {_nats(ce)} nats/token (perplexity "
        f"{fmt_value(last.get('val/ppl'), '')}); unigram baseline {_nats(base)} nats/token "
        f"(perplexity {fmt_value(info.unigram_val_ppl, '')})."
    )
    warnings = language_model_warnings(ce, base) if base is not None else []
    return " ".join([text, *warnings])


def _curves_html(run: RunData) -> str:
    """One run's nats/token and perplexity per observed epoch and split
    (``{split}/ce``, ``{split}/ppl`` of its history, as recorded), under its baseline line."""
    head = ["epoch"] + [f"{s} {q}" for s in SPLITS for q in ("nats/token", "perplexity")]
    rows = [
        [str(row.get("epoch"))]
        + [
            x
            for s in SPLITS
            for x in (_nats(row.get(f"{s}/ce")), fmt_value(row.get(f"{s}/ppl"), ""))
        ]
        for row in run.rows
    ]
    return (
        f"<h3>{esc(run.run_id)}: nats per token and perplexity by epoch</h3>"
        f"<p class='lm-baseline'>{esc(_baseline_text(run))}</p>"
        + _table(
            f"lm-curves-{run.run_id}",
            f"{run.run_id}: token cross-entropy by epoch",
            head,
            rows,
            [True] * len(head),
        )
    )


def _mask_rows(rec: Mapping[str, Any]) -> list[list[str]]:
    """Every evaluated mask, fewest kept blocks first: its blocks, val and test
    nats/token and perplexity, test damage (nats/token against the full network), FLOPs."""
    rows = []
    for m in sorted(rec["masks"], key=lambda m: (m["kept"], m["mask"])):
        rows.append(
            [
                m["mask"],
                str(m["kept"]),
                _nats(m["val"]["ce"]),
                fmt_value(m["val"]["ppl"], ""),
                _nats(m["test"]["ce"]),
                fmt_value(m["test"]["ppl"], ""),
                fmt_value(m["test"].get("damage"), "nats", signed=True, suffix=False),
                fmt_value(m.get("flops_per_token"), "", digits=6),
                fmt_value(m["flops_fraction"], "×"),
            ]
        )
    return rows


def _greedy_rows(rec: Mapping[str, Any]) -> list[list[str]]:
    by_mask = {m["mask"]: m for m in rec["masks"]}
    rows = []
    for p in rec["greedy"]:
        m = by_mask[p["mask"]]
        rows.append(
            [
                str(p["step"]),
                str(p["removed"]),
                p["mask"],
                _nats(m["test"]["ce"]),
                fmt_value(m["test"]["ppl"], ""),
                fmt_value(p.get("test_damage"), "nats", signed=True, suffix=False),
                fmt_value(m["flops_fraction"], "×"),
                str((p.get("verdict") or {}).get("verdict", "—")),
            ]
        )
    return rows


def _audit_html(audit: Mapping[str, Any]) -> str:
    """Per run and checkpoint: the coverage, the audit's own sentences
    (:mod:`fathom.stats.audit_sentences`), the greedy removal path and every mask's row."""
    out = ["<h3 id='lm-audit'>Layer-removal audit</h3>"]
    for run in audit.get("runs", []):
        for which, rec in run.get("checkpoints", {}).items():
            tag = f"{run['run_id']}-{which}"
            if "missing" in rec:
                out.append(f"<p class='note'>{esc(run['run_id'])}, {esc(which)}: "
                           f"{esc(rec['missing'])}</p>")  # fmt: skip
                continue
            out.append(
                f"<p><b>{esc(run['run_id'])}</b>, {esc(which)} checkpoint (epoch "
                f"{esc(rec['epoch'])}): {esc(rec['coverage']['text'])}.</p>"
                f"<ul class='verdicts' id='lm-sentences-{esc(tag)}'>"
                + "".join(f"<li>{esc(x)}</li>" for x in rec["sentences"])
                + "</ul>"
            )
            out.append(_table(
                f"lm-greedy-{tag}", "Greedy removal path (test split)",
                ["step", "block removed", "kept blocks", "test nats/token", "test perplexity",
                 "damage (nats/token)", "FLOPs of full (×)", "verdict"],
                _greedy_rows(rec), [True, True, False, True, True, True, True, False],
            ))  # fmt: skip
            masks = _table(
                f"lm-masks-{tag}", "Every evaluated mask (1 = block kept, block 0 first)",
                ["kept blocks", "kept", "val nats/token", "val perplexity", "test nats/token",
                 "test perplexity", "test damage (nats/token)", "FLOPs/token",
                 "FLOPs of full (×)"],
                _mask_rows(rec), [False] + [True] * 8,
            )  # fmt: skip
            out.append(details(f"every mask ({len(rec['masks'])})", masks))
    out.append(
        "<p class='note'>Damage: a reduced network's test nats/token minus the full "
        "network's, on the same contiguous chunks; perplexity exp(nats/token); FLOPs counted "
        "per token of the reduced network's forward pass.</p>"
    )
    return "".join(out)


def _scaling_html(root: Path) -> str:
    """The language-model benchmark's verdict (:func:`_scaling_table`), its level and
    trend answers and the lines they rest on, when ``root`` is one."""
    table = _scaling_table(root)
    if table is None:
        return ""
    v = table["verdict"]
    return (
        "<h3 id='lm-scaling'>Depth scaling: LayerDrop vs dense</h3>"
        f"<p>Metric: {esc(table['metric'])}. <b>Level:</b> {esc(v['level'])}. "
        f"<b>Scaling:</b> {esc(v['trend'])}.</p><ul class='verdicts' id='lm-scaling-lines'>"
        + "".join(f"<li>{esc(x)}</li>" for x in v["lines"])
        + "</ul>"
    )


_FIGURES: dict[str, str] = {
    "lm_curves.png": "Figure: validation (solid) and test (dashed) nats per token by epoch, per run",
    "lm_removal.png": "Figure: test nats per token of every evaluated mask against its FLOPs "
    "(fraction of the full network)",
}
"""The figures :func:`lm_figures` writes, by file name, with the caption the page gives them."""


def _figure_html(path: Path) -> str:
    """One of :func:`lm_figures`' PNGs embedded in the page as a ``data:image/png;base64``
    image (the page stays one self-contained file), under a collapsed section that loads
    when opened (:func:`fathom.report.lazy.details`); the same bytes as the file beside
    ``summary.md``."""
    data = base64.b64encode(path.read_bytes()).decode()
    caption = _FIGURES[path.name]
    body = (
        f"<figure id='lm-figure-{esc(path.stem)}'><img alt='{esc(caption)}' "
        f"src='data:image/png;base64,{data}'><figcaption>{esc(caption)} "
        f"(<code>figures/{esc(path.name)}</code>)</figcaption></figure>"
    )
    return details(esc(caption), body)


def lm_html(
    runs: Sequence[RunData],
    audit: Mapping[str, Any] | None,
    root: Path,
    figures: Sequence[Path] = (),
) -> str:
    """The ``report.html`` language-model section (empty without a language model run or
    a language-model benchmark): curves against the unigram baseline, the audit, the
    depth-scaling verdict; ``figures``: the PNGs :func:`lm_figures` wrote, each embedded
    after the tables it draws (:func:`_figure_html`)."""
    lms = [r for r in runs if is_language_model(r)]
    scaling = _scaling_html(root)
    if not lms and not scaling:
        return ""
    drawn = {p.name: p for p in figures if p.name in _FIGURES}
    out = [
        "<p class='note'>Nats per token: token cross-entropy over the valid positions; "
        "perplexity exp(nats/token). The Curves section draws the same fields "
        "({split}/ce, {split}/ppl) by epoch or clock.</p>"
    ]
    out += [_curves_html(r) for r in lms]
    if "lm_curves.png" in drawn:
        out.append(_figure_html(drawn["lm_curves.png"]))
    if is_lm_audit(audit):
        out.append(_audit_html(audit))  # type: ignore[arg-type]
        if "lm_removal.png" in drawn:
            out.append(_figure_html(drawn["lm_removal.png"]))
    return "".join(out) + scaling
