"""The report's headline sections: what was run, the verdicts, the main table, the audit.

Rendered once in Python from ``summary.json`` and ``audit.json``; no number here is new,
every one is read from those files (accuracy converted by :func:`fathom.units.percent`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fathom.report.runs import RunData
from fathom.report.tables import esc, headline_table
from fathom.stats.numbers import table_text
from fathom.stats.summary_tables import tables_of


def what_was_run(summary: Mapping[str, Any] | None, runs: Sequence[RunData]) -> str:
    """Study, recipes, seeds, scale (from a main run's config) and what was scaled down."""
    main = [r for r in runs if r.phase is None]
    tuning = [r for r in runs if r.phase is not None]
    cfg = (main or list(runs))[0].config if runs else {}
    data, optim, model = cfg.get("data") or {}, cfg.get("optim") or {}, cfg.get("model") or {}
    recipes = sorted({r.recipe for r in main})
    seeds = sorted({r.seed for r in main if r.seed is not None})
    items = [
        f"<b>{len(main)}</b> main runs: {len(recipes)} recipes ({esc(', '.join(recipes))}) × "
        f"seeds {esc(', '.join(map(str, seeds)))}"
        + (f"; {len(tuning)} tuning runs (learning-rate grid)" if tuning else ""),
        f"data: {esc(data.get('dataset', '?'))}, split {esc(data.get('split', '?'))}"
        + (f", fitting subset {data['fit_subset']:,}" if data.get("fit_subset") else "")
        + (f", val/test subset {data['eval_subset']:,}" if data.get("eval_subset") else ""),
        f"model: {esc(model.get('kind', '?'))}, width × {model.get('width_mult', 1.0):g}; "
        f"{optim.get('epochs', '?')} epochs, batch {optim.get('batch_size', '?')}",
    ]
    out = "<ul class='facts'>" + "".join(f"<li>{x}</li>" for x in items) + "</ul>"
    out += _scale_down(summary)
    return out


def _scale_down(summary: Mapping[str, Any] | None) -> str:
    """The computed scale-down statement (``scale_down_sentence``, written by
    :mod:`fathom.study.scaledown` from the config against the full protocol); an older
    summary without it shows the study's own notes, labelled as not computed."""
    if summary is None:
        return ""
    sentence = summary.get("scale_down_sentence")
    if sentence:
        return f"<p class='scaled' id='scaled-down'><b>{esc(sentence)}</b></p>"
    notes = list(summary.get("scale_down") or [])
    text = "; ".join(notes) if notes else "none listed"
    return (
        "<p class='scaled' id='scaled-down'><b>Scale-down (the study's own notes, not computed "
        f"against the full protocol by this older summary):</b> {esc(text)}.</p>"
    )


def verdict_sentences(stats: Mapping[str, Any]) -> list[str]:
    """The computed sentences of the summary's results model (``stats["results"]``; an older
    summary without it: each comparison's own sentence) — the ranking statements
    (:mod:`fathom.stats.ranking`) among them — and its multiplicity note."""
    results = stats.get("results") or {}
    texts = [s["text"] for s in results.get("sentences") or []]
    if not results:
        texts = [c["sentence"] for c in stats.get("comparisons") or [] if c.get("sentence")]
    return [*texts, *(stats.get("notes") or [])[:1]]


def main_table(stats: Mapping[str, Any]) -> str:
    """Per recipe: selected and final test accuracy and CE (mean ± sample SD) and paired
    differences against the reference with their intervals: the summary's typed ``main``
    table (:mod:`fathom.stats.summary_tables`), every cell printed by ``fmt_cell``."""
    ref = stats.get("reference")
    t = tables_of(stats)["main"]
    table = headline_table("main-table", t.title, t.columns, table_text(t))
    notes = " ".join(stats.get("notes") or [])
    return (
        table + "<p class='note'>Mean ± sample SD over seeds. Δ: paired difference recipe − "
        f"{esc(ref)} over seeds with its interval. {esc(notes)} Accuracy in %, differences in "
        "percentage points.</p>"
    )


def answer_section(summary: Mapping[str, Any] | None, runs: Sequence[RunData]) -> str:
    out = ["<h2 id='answer'>What was run and what it shows</h2>", what_was_run(summary, runs)]
    stats = (summary or {}).get("stats") if summary and "stats" in summary else summary
    if not stats or "recipes" not in stats:
        out.append(
            "<p class='note'>No summary.json in this directory: no verdicts or main table (run `fathom study run` to write one).</p>"
        )
        return "\n".join(out)
    sentences = verdict_sentences(stats)
    out.append(
        "<h3>Verdicts</h3><ul id='verdicts' class='verdicts'>"
        + "".join(f"<li>{esc(s)}</li>" for s in sentences)
        + "</ul>"
    )
    out.append(main_table(stats))
    return "\n".join(out)
