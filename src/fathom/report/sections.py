"""The report's headline sections: what was run, the main table, the verdicts — the decided
ones listed, the undecided ones ("not established") collapsed into their count.

Rendered once in Python from ``summary.json`` and ``audit.json``; no number here is new,
every one is read from those files (accuracy converted by :func:`fathom.base.units.percent`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fathom.report.render import collapsed_sentences
from fathom.report.runs import RunData
from fathom.report.tables import esc, headline_table
from fathom.rundir.record import RecordedConfig
from fathom.stats.numbers import table_text
from fathom.stats.results import NOT_ESTABLISHED, Results
from fathom.stats.sentences import undecided_note
from fathom.stats.summary_tables import tables_of


def what_was_run(summary: Mapping[str, Any] | None, runs: Sequence[RunData]) -> str:
    """Study, recipes, seeds, scale (from a main run's config) and what was scaled down."""
    return _facts(runs) + _scale_down(summary)


def _facts(runs: Sequence[RunData]) -> str:
    """Study, recipes, seeds and scale, from a main run's config: three short lines."""
    main = [r for r in runs if r.phase is None]
    tuning = [r for r in runs if r.phase is not None]
    cfg = (main or list(runs))[0].recorded.config if runs else RecordedConfig()
    data, optim, model = cfg.data, cfg.optim, cfg.model
    recipes = sorted({r.recipe for r in main})
    seeds = sorted({r.seed for r in main if r.seed is not None})
    items = [
        f"<b>{len(main)}</b> main runs: {len(recipes)} recipes ({esc(', '.join(recipes))}) × "
        f"seeds {esc(', '.join(map(str, seeds)))}"
        + (f"; {len(tuning)} tuning runs (learning-rate grid)" if tuning else ""),
        f"data: {esc(_said(data, 'dataset'))}, "
        + (  # a text corpus is cut into windows of a context, not into a named split
            f"context {esc(data.context)} tokens"
            if data.context
            else f"split {esc(_said(data, 'split'))}"
        )
        + (f", fitting subset {data.fit_subset:,}" if data.fit_subset else "")
        + (f", val/test subset {data.eval_subset:,}" if data.eval_subset else ""),
        f"model: {esc(_said(model, 'kind'))}, {_shape(model.as_json())}; "
        f"{_said(optim, 'epochs')} epochs, batch {_said(optim, 'batch_size')}",
    ]
    return "<ul class='facts'>" + "".join(f"<li>{x}</li>" for x in items) + "</ul>"


def _said(section: Any, name: str) -> Any:
    """``section``'s field ``name`` as recorded (``None`` where recorded as ``null``), ``?``
    where the manifest does not record it."""
    return getattr(section, name) if name in section.given() else "?"


def _shape(model: dict[str, Any]) -> str:
    """A model's size in its own config's terms, by its kind's row
    (:attr:`fathom.config.model_kinds.ModelKind.size`): ``width × 0.1``, ``3 blocks of width
    16``; ``size not readable`` for a table this version cannot read."""
    from fathom.config.model_kinds import recorded_model

    recorded = recorded_model(model)
    return recorded[0].size(recorded[1]) if recorded else "size not readable"


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


def split_sentences(stats: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(decided, undecided)`` sentences of the summary, each text once, in the order of
    its first print.

    A sentence is *undecided* when it makes at least one claim or decision and every one of
    them is ``not established`` (:data:`fathom.stats.results.NOT_ESTABLISHED`); every other
    sentence (a direction, an equivalence, a "no comparison" with its reason, a sentence that
    claims nothing) is *decided*. An older summary without a results model: each
    comparison's own sentence, classified by its ``verdict``."""
    raw = stats.get("results")
    if not raw:
        pairs = [
            (c["sentence"], [c.get("verdict")])
            for c in stats.get("comparisons") or []
            if c.get("sentence")
        ]
    else:
        results = Results.model_validate(raw)
        verdicts = {d.id: d.verdict for d in results.decisions}
        pairs = [
            (
                s.text,
                [c.verdict for c in s.claims] + [verdicts.get(d) for d in s.decisions],
            )
            for s in results.sentences
        ]
    idle: dict[str, bool] = {}  # a text printed twice: decided if either print is
    for text, vs in pairs:
        idle[text] = idle.get(text, True) and bool(vs) and all(v == NOT_ESTABLISHED for v in vs)
    return [t for t, x in idle.items() if not x], [t for t, x in idle.items() if x]


def main_table(stats: Mapping[str, Any]) -> str:
    """Per recipe: selected and final test accuracy and CE (mean ± sample SD) and paired
    differences against the reference with their intervals: the summary's typed ``main``
    table (:mod:`fathom.stats.summary_tables`), every cell printed by ``fmt_cell``."""
    ref = stats.get("reference")
    t = tables_of(stats)["main"]
    table = headline_table("main-table", t.title, t.columns, table_text(t))
    return (
        table + "<p class='note'>Mean ± sample SD over seeds. Δ: paired difference recipe − "
        f"{esc(ref)} over seeds with its interval. Accuracy in %, differences in "
        "percentage points.</p>"
    )


def _verdicts_block(stats: Mapping[str, Any]) -> str:
    """The decided sentences as a list (``#verdicts``), the undecided ones collapsed into a
    count that opens (``#undecided``), then the summary's notes (multiplicity, resolution)."""
    decided, undecided = split_sentences(stats)
    items = [f"<li>{esc(s)}</li>" for s in decided] or [
        "<li class='note'>No comparison is decided: every interval is too wide to call a "
        "direction or an equivalence (below).</li>"
    ]
    out = "<h3>Verdicts</h3><ul id='verdicts' class='verdicts'>" + "".join(items) + "</ul>"
    out += collapsed_sentences(
        undecided,
        undecided_note(
            len(undecided),
            "comparison(s)",
            ": each interval neither excludes the region of no interest nor lies inside it",
        )
        + " Show them.",
        id_="undecided",
    )
    notes = stats.get("notes") or []
    if notes:
        out += "<p class='note'>" + " ".join(esc(n) for n in notes) + "</p>"
    return out


def answer_section(summary: Mapping[str, Any] | None, runs: Sequence[RunData]) -> str:
    """What was run, then the main table and the decided verdicts (the first screen), the
    undecided comparisons collapsed into their count, then the scale-down statement."""
    out = ["<h2 id='answer'>What was run and what it shows</h2>", _facts(runs)]
    stats = (summary or {}).get("stats") if summary and "stats" in summary else summary
    if not stats or "recipes" not in stats:
        out.append(
            "<p class='note'>No summary.json in this directory: no verdicts or main table (run `fathom study run` to write one).</p>"
        )
        out.append(_scale_down(summary))
        return "\n".join(out)
    out += [main_table(stats), _verdicts_block(stats), _scale_down(summary)]
    return "\n".join(out)
