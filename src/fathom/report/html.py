"""``report.html``: one self-contained file, all script and data inline, no network request.

Plotting choice. The page carries hundreds of fields for tens of runs, and the explorer
shows one field at a time. A general plotting library (Plotly: ~3.5 MB minified; Vega:
~0.8 MB with its runtime) would have to be inlined to keep the file self-contained and
would dwarf the data of a small study; and drawing every field as a hidden trace would
multiply the DOM by the field count. Instead the data are embedded once, as compact
columnar JSON (one global list of field names; per run, one value array per recorded
field, ``null`` where a run lacks the field), and a ~300-line hand-written SVG plotter
(``explorer.js``) draws only the traces of the current selection, rebuilding them on
each selector change. It needs no build step, makes no request (a Content-Security-Policy
``default-src 'none'`` enforces it) and exposes the plotted data on ``window.fathomPlot``
for the browser test.

Values are embedded exactly as read (JSON floats round-trip through shortest repr), so
a plotted point equals the history value; non-finite floats are the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"`` and are drawn as gaps like nulls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from string import Template
from typing import Any

from fathom.report.fields import CORE, describe, split_key
from fathom.report.runs import SPLITS, RunData, nonfinite_name, scalar_fields
from fathom.report.tables import (
    audit_section,
    curvature_section,
    esc,
    provenance_section,
    study_section,
)

AXES = {
    "epoch": "epoch",
    "clock/training_s": "training clock (s)",
    "clock/elapsed_s": "elapsed time (s)",
}
_CLASS_ACC = re.compile(r"^split/(fit|val|test)/class_acc/(\d+)$")


def _encode(v: Any) -> Any:
    name = nonfinite_name(v)
    return v if name is None else name


def explorer_payload(runs: Sequence[RunData]) -> dict[str, Any]:
    """The columnar data the explorer script reads (see the module docstring)."""
    names = sorted(n for n in scalar_fields(list(runs)) if n != "epoch")
    keys: dict[str, str] = {}
    splits: set[str] = set()
    classes = 0
    for n in names:
        key, split = split_key(n)
        keys.setdefault(key, n)
        if split:
            splits.add(split)
        m = _CLASS_ACC.match(n)
        if m:
            classes = max(classes, int(m.group(2)) + 1)
    payload_runs = []
    for run in runs:
        present = {k for row in run.rows for k in row}
        cols = [[_encode(row.get(n)) for row in run.rows] if n in present else None for n in names]
        payload_runs.append(
            {
                "id": run.run_id,
                "cohort": run.cohort,
                "recipe": run.recipe,
                "lr": run.lr,
                "seed": run.seed,
                "status": run.manifest.get("status"),
                "flagged": run.flag_reasons,
                "epochs": [row["epoch"] for row in run.rows],
                "cols": cols,
            }
        )
    fields = sorted(keys, key=lambda k: (k not in CORE, k))  # the trainer's own fields first
    default = "{split}/acc" if "{split}/acc" in keys else (fields[0] if fields else "")
    return {
        "names": names,
        "fields": fields,
        "meta": {k: describe(k, ex) for k, ex in keys.items()},
        "splits": [s for s in SPLITS if s in splits],
        "classes": classes,
        "axes": AXES,
        "defaultField": default,
        "runs": payload_runs,
    }


def _json_for_script(obj: Any) -> str:
    """Strict JSON safe inside ``<script>``: every ``<`` escaped as ``\\u003c``."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def render_html(
    title: str,
    runs: Sequence[RunData],
    *,
    summary: Mapping[str, Any] | None = None,
    audit: Mapping[str, Any] | None = None,
    curvature: Mapping[str, Mapping[str, Any]] | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The whole page. ``curvature`` maps ``"<run>/<file>"`` to a snapshot's JSON."""
    sections: list[str] = []
    if summary is not None:
        sections.append('<h2 id="study">Study tables</h2>' + study_section(summary))
    else:
        sections.append(
            '<h2 id="study">Study tables</h2><p class="note">No summary.json in this directory (run `fathom study run` to write one).</p>'
        )
    if audit is not None:
        sections.append('<h2 id="audit">Audit: mask explorer</h2>' + audit_section(audit))
    if curvature:
        sections.append('<h2 id="curvature">Curvature</h2>' + curvature_section(curvature))
    sections.append(
        '<h2 id="provenance">Provenance</h2>' + "\n".join(provenance_section(r) for r in runs)
    )
    flagged = [f"{r.run_id}: {reason}" for r in runs for reason in r.flag_reasons]
    warnings = list(notes) + flagged
    warn_html = (
        '<div class="warn"><b>Flagged input</b><ul>'
        + "".join(f"<li>{esc(w)}</li>" for w in warnings)
        + "</ul></div>"
        if warnings
        else ""
    )
    page = Template(resources.files("fathom.report").joinpath("template.html").read_text())
    script = resources.files("fathom.report").joinpath("explorer.js").read_text()
    cohorts = sorted({r.cohort for r in runs})
    subtitle = (
        f"{len(runs)} runs, {len(cohorts)} cohorts; data read from run directories. "
        "Self-contained: opens from disk, makes no network request."
    )
    return page.substitute(
        title=esc(title),
        subtitle=esc(subtitle),
        warnings=warn_html,
        sections="\n".join(sections),
        data=_json_for_script(explorer_payload(runs)),
        script=script,
    )
