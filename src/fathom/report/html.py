"""``report.html``: one self-contained file, all script, style and data inline, no request.

Layout (what a reader sees first, at 1240 × 800): what was run, the main table and the
decided verdicts, the undecided ones collapsed into their count (:mod:`fathom.report.sections`);
then the curves, the audit headline and the mask and example explorer, the cross-run
telemetry and curvature tables, and raw tables collapsed. The page states its one direction
once (:func:`_conventions`: differences recipe − reference, ratios recipe / reference). A
collapsed section of 16 KiB or more, and the mask data, are stored compressed and decoded in
the page (:mod:`fathom.report.lazy`).

Plotting: uPlot 1.6.32 (MIT, vendored under ``report/vendor``) inlined with its CSS; a
Content-Security-Policy ``default-src 'none'`` forbids every request. Data are embedded
once as columnar JSON: one global list of field names; per run, one value array per
recorded field. Cell encoding: a number; ``null`` for a value that was due but is null;
``"NaN"``, ``"Infinity"``, ``"-Infinity"`` for non-finite floats (all drawn as gaps); and
``"-"`` where the row does not hold the field at all (not scheduled that epoch), which the
plot spans, connecting the recorded points. Accuracy fields are converted to percent here
by :func:`fathom.base.units.percent`, the one conversion; every other value is embedded
exactly as read (a plotted point equals the history value).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from string import Template
from typing import Any

from fathom.base.units import percent
from fathom.config.models import SPLITS
from fathom.report.audit_view import audit_headline
from fathom.report.crossrun import study_alignment
from fathom.report.crosstable import CrossTable
from fathom.report.curvtables import trace_contrasts
from fathom.report.fields import (
    describe,
    facet_cached,
    facet_key,
    is_accuracy,
    is_trainer_field,
    split_key,
)
from fathom.report.figures import recipe_colours
from fathom.report.layers import LayerAlignment
from fathom.report.lazy import details, encode
from fathom.report.lm import is_language_model
from fathom.report.raw import (
    audit_section,
    curvature_section,
    provenance_section,
    study_section,
)
from fathom.report.render import collapsed_sentences, table_html
from fathom.report.runs import RunData, nonfinite_name, scalar_fields, widest_first
from fathom.report.sections import answer_section
from fathom.report.tables import esc
from fathom.stats.results import NOT_ESTABLISHED
from fathom.stats.sentences import undecided_note

_AXES = {
    "epoch": "epoch",
    "clock/training_s": "training clock (s)",
    "clock/elapsed_s": "elapsed time (s)",
}
_NOT_RECORDED = "-"


def _encode(v: Any, accuracy: bool) -> Any:
    name = nonfinite_name(v)
    if name is not None:
        return name
    return percent(v) if accuracy and v is not None else v


def _natural(name: str) -> list[tuple[int, int | str]]:
    """A sort key reading the digit runs of ``name`` as numbers (``blocks.2 < blocks.10``)."""
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.findall(r"\d+|\D+", name)]


def _fields(
    runs: Sequence[RunData], recorded: Sequence[str], alignment: LayerAlignment
) -> tuple[dict[str, dict[str, Any]], list[str], dict[str, dict[str, str]]]:
    """Generic field keys (over split and facet) with an example name and facets in order,
    the splits, and per run the layer names that differ from their aligned facet label.

    A layer facet is the layer's aligned label (:mod:`fathom.report.layers`): the same
    network layer of every recipe is one small multiple, in model order."""
    keys: dict[str, dict[str, Any]] = {}
    splits: set[str] = set()
    for n in recorded:
        key, split = split_key(n)
        if split:
            splits.add(split)
        generic, kind, _facet = facet_key(key, n)
        keys.setdefault(generic, {"example": n, "kind": kind, "facets": []})
    renamed: dict[str, dict[str, str]] = {}
    for run in runs:
        for n in dict.fromkeys(k for row in run.rows for k in row):
            generic, kind, facet = facet_cached(split_key(n)[0], n)
            if facet is None or generic not in keys:
                continue
            label = alignment.label(run.run_id, facet) if kind == "layer" else facet
            if label != facet:
                renamed.setdefault(run.run_id, {})[label] = facet
            if label not in keys[generic]["facets"]:
                keys[generic]["facets"].append(label)
    order = {lab: i for i, lab in enumerate(alignment.labels)}
    for entry in keys.values():
        if entry["facets"] and all(re.fullmatch(r"L?\d+", f) for f in entry["facets"]):
            entry["facets"].sort(key=lambda f: int(f.lstrip("L")))
        elif entry["kind"] == "layer":
            entry["facets"].sort(key=lambda f: order.get(f, len(order)))
        elif entry["kind"] == "block":  # model order: blocks.2 before blocks.10
            entry["facets"].sort(key=_natural)
    return keys, [s for s in SPLITS if s in splits], renamed


def explorer_payload(
    runs: Sequence[RunData], alignment: LayerAlignment | None = None
) -> dict[str, Any]:
    """The columnar data the explorer script reads (see the module docstring); per run,
    ``layers`` maps an aligned layer label to the run's own layer name where they differ."""
    recorded = [n for n in scalar_fields(widest_first(list(runs))) if n != "epoch"]
    names = sorted(recorded)
    if alignment is None:
        alignment = study_alignment(runs, None)
    keys, splits, renamed = _fields(runs, recorded, alignment)
    payload_runs = []
    for run in runs:
        present = {k for row in run.rows for k in row}
        cols = [
            [_encode(row[n], is_accuracy(n)) if n in row else _NOT_RECORDED for row in run.rows]
            if n in present
            else None
            for n in names
        ]
        payload_runs.append(
            {
                "id": run.run_id,
                "cohort": run.cohort,
                "recipe": run.recipe,
                "phase": run.phase or "main",
                "lr": run.lr,
                "seed": run.seed,
                "status": run.recorded.status,
                "flagged": run.flag_reasons,
                "epochs": [row["epoch"] for row in run.rows],
                "layers": renamed.get(run.run_id, {}),
                "cols": cols,
            }
        )
    fields = sorted(
        keys, key=lambda k: (not is_trainer_field(k), k)
    )  # the trainer's own fields first
    meta = {}
    for k, e in keys.items():
        m = describe(e["example"])
        if is_accuracy(e["example"]):
            m["units"] = "%"
        m.update(facetKind=e["kind"], facets=e["facets"])
        meta[k] = m
    first = (
        ("{split}/ce", "{split}/acc")
        if any(map(is_language_model, runs))
        else ("{split}/acc", "{split}/ce")
    )  # a language model is read in nats per token (its token accuracy is recorded too)
    default = next((k for k in first if k in keys), fields[0] if fields else "")
    return {
        "names": names,
        "fields": fields,
        "meta": meta,
        "splits": splits,
        "axes": _AXES,
        "defaultField": default,
        "colours": recipe_colours([r.recipe for r in runs]),
        "baselines": baselines(runs),
        "runs": payload_runs,
    }


def baselines(runs: Sequence[RunData]) -> list[dict[str, Any]]:
    """The reference levels the explorer draws flat (dashed) under a field: a language
    model's unigram baseline on validation (``data.info``: ``unigram_val_ce`` under
    ``{split}/ce``, ``unigram_val_ppl`` under ``{split}/ppl``), once per distinct value."""
    out: list[dict[str, Any]] = []
    for run in runs:
        if not is_language_model(run):
            continue
        info = run.recorded.data.info
        for field, value in (
            ("{split}/ce", info.unigram_val_ce),
            ("{split}/ppl", info.unigram_val_ppl),
        ):
            b = {"field": field, "split": "val", "value": value, "label": "unigram baseline"}
            if isinstance(value, (int, float)) and math.isfinite(value) and b not in out:
                out.append(b)
    return out


def _json_for_script(obj: Any) -> str:
    """Strict JSON safe inside ``<script>``: every ``<`` escaped as ``\\u003c``."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _resource(name: str) -> str:
    return resources.files("fathom.report").joinpath(name).read_text()


def _by_file(curvature: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``"<run>/<file>" -> JSON`` for the raw curvature tables."""
    out: dict[str, Any] = {}
    for run_id, c in curvature.items():
        if c.get("summary") is not None:
            out[f"{run_id}/summary.json"] = c["summary"]
        for e, rec in sorted((c.get("epochs") or {}).items()):
            out[f"{run_id}/epoch-{e:04d}.json"] = rec
    return out


def _tables_section(tables: Sequence[CrossTable], names: Sequence[str]) -> str:
    return "\n".join(table_html(t, f"x-{t.name}") for t in tables if t.name in names)


def _curvature_html(
    crossrun: Sequence[CrossTable],
    curvature: Mapping[str, Mapping[str, Any]],
    reference: str | None,
    runs: Sequence[RunData],
) -> str:
    """Curvature trace sentences (the established ones listed, the others collapsed into
    their count), the curvature tables and the raw snapshots (collapsed)."""
    out = _tables_section(crossrun, ("curvature_traces", "kfac_errors"))
    traces = next((t for t in crossrun if t.name == "curvature_traces"), None)
    ref = reference or (traces.rows[0]["recipe"] if traces else None)
    contrasts = trace_contrasts(runs, ref, curvature)
    if contrasts:
        shown = [c["sentence"] for c in contrasts if c["verdict"] != NOT_ESTABLISHED]
        idle = [c["sentence"] for c in contrasts if c["verdict"] == NOT_ESTABLISHED]
        out = (
            "<ul class='verdicts' id='curvature-verdicts'>"
            + "".join(f"<li>{esc(x)}</li>" for x in shown)
            + "</ul>"
            + collapsed_sentences(
                idle,
                undecided_note(len(idle), "curvature contrast(s)", f" (ratios recipe / {ref})")
                + " Show them.",
                id_="curvature-undecided",
            )
            + out
        )
    if curvature:
        out += details("raw curvature snapshots", curvature_section(_by_file(curvature)))
    return out


def _audit_html(audit: Mapping[str, Any] | None) -> str:
    if audit is None:
        return ""
    return audit_headline(audit) + details(
        "raw audit tables (every run, checkpoint and mask)", audit_section(audit)
    )


def _warnings_html(runs: Sequence[RunData], notes: Sequence[str]) -> str:
    warnings = list(notes) + [f"{r.run_id}: {reason}" for r in runs for reason in r.flag_reasons]
    if not warnings:
        return ""
    return (
        f'<details class="warn"><summary><b>Flagged input</b> ({len(warnings)})</summary><ul>'
        + "".join(f"<li>{esc(w)}</li>" for w in warnings)
        + "</ul></details>"
    )


def _conventions(reference: str | None) -> str:
    """The page's one direction for comparisons, said once at the top."""
    ref = reference or "the reference recipe"
    return (
        f"Every difference on this page is recipe − {ref} and every ratio recipe / {ref} "
        "(×); accuracy in %, differences in percentage points (pp), CE in nats. Large "
        "collapsed sections load when opened."
    )


def render_html(
    title: str,
    runs: Sequence[RunData],
    *,
    summary: Mapping[str, Any] | None = None,
    audit: Mapping[str, Any] | None = None,
    curvature: Mapping[str, Mapping[str, Any]] | None = None,
    crossrun: Sequence[CrossTable] = (),
    masks: Mapping[str, Any] | None = None,
    notes: Sequence[str] = (),
    alignment: LayerAlignment | None = None,
    unfinished: Sequence[str] = (),
    reference: str | None = None,
    language_model: str = "",
) -> str:
    """The whole page. ``curvature`` maps a run id to its ``{"summary", "epochs"}``;
    ``alignment``: the layer alignment of the curves' small multiples (default: the runs');
    ``reference``: the cross-run tables' reference recipe, where the summary names none;
    ``language_model``: the language-model section (:func:`fathom.report.lm.lm_html`),
    shown with its own heading and link when not empty (its audit then stands in for the
    classifier audit's)."""
    reference = ((summary or {}).get("stats") or summary or {}).get("reference") or reference
    raw = (
        ""
        if summary is None
        else details("study summary.json, every table", study_section(summary))
    )
    cohorts = sorted({r.cohort for r in runs})
    subtitle = (
        "".join(f"NOT FINISHED: {x}. " for x in unfinished)
        + f"{len(runs)} runs, {len(cohorts)} cohorts; data read from run directories. "
        "Self-contained: opens from disk, makes no network request."
    )
    none = "<p class='note'>{}</p>"
    return Template(_resource("template.html")).substitute(
        title=esc(title),
        subtitle=esc(subtitle),
        conventions=esc(_conventions(reference)),
        warnings=_warnings_html(runs, notes),
        answer=answer_section(summary, runs),
        quality=_tables_section(crossrun, ("fitting", "digits_test"))
        or none.format("No fitting or per-digit scores in the histories."),
        audit=_audit_html(audit)
        or (
            none.format("The language model's layer-removal audit is in its section above.")
            if "id='lm-audit'" in language_model
            else none.format("No audit/audit.json in this directory (run `fathom audit DIR`).")
        ),
        language_model=(
            f"<h2 id='language-model'>Language model</h2>{language_model}" if language_model else ""
        ),
        lm_nav="<a href='#language-model'>Language model</a>" if language_model else "",
        telemetry=_tables_section(crossrun, ("gradients", "zero_activations"))
        or none.format("No fixed-probe telemetry in the histories."),
        curvature=_curvature_html(crossrun, curvature or {}, reference, runs)
        or none.format("No curvature snapshots (run `fathom curvature RUN_DIR`)."),
        raw=raw,
        provenance=details(
            f"every run's manifest: identity, hashes, environment and clocks ({len(runs)} runs)",
            "\n".join(provenance_section(r) for r in runs),
            attrs="id='provenance-runs'",
        ),
        data=_json_for_script(explorer_payload(runs, alignment)),
        masks=encode(_json_for_script(masks or {"tables": [], "examples": {}})),
        uplot_css=_resource("vendor/uPlot.min.css"),
        uplot=_resource("vendor/uPlot.iife.min.js"),
        script=_resource("explorer.js"),
    )
