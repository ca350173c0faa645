"""The report's raw sections: the study summary's every table, provenance per run, every
audited mask and checkpoint, and the curvature snapshots; collapsed on the page.

Built from :mod:`fathom.report.tables`' primitives; any key these functions do not know
is still shown through :func:`fathom.report.tables.generic`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.base.units import fmt_value, percent
from fathom.report.tables import esc, flat, generic, table
from fathom.stats.numbers import table_text
from fathom.stats.results import Table
from fathom.stats.summary_tables import tables_of, tuning_table


def _typed_table(t: Table, *, interactive: bool = False, caption: str | None = None) -> str:
    """A :class:`~fathom.stats.results.Table` of the summary as HTML: its columns and every
    cell printed by :func:`fathom.stats.numbers.fmt_cell` (no number derived here)."""
    return table(t.columns, table_text(t), interactive=interactive, caption=caption or t.title)


def study_section(summary: Mapping[str, Any]) -> str:
    """The study tables of ``summary.json``.

    Either the study runner's file (``study``, ``scale_down``, ``devices``, ``tuning`` with
    its ``grid``, ``runs``, and the statistics under ``stats``) or a bare
    :func:`fathom.stats.summarise_study` output.
    """
    if "stats" not in summary:
        return stats_tables(summary)
    out = [
        f"<p>Study <b>{esc(summary.get('study'))}</b>: {esc(summary.get('description') or '')}</p>"
    ]
    if summary.get("scale_down"):
        out.append(
            "<p class='note'>Scaled down from the full protocol: "
            + esc("; ".join(summary["scale_down"]))
            + "</p>"
        )
    if summary.get("devices"):
        out.append(f"<p class='note'>Device(s): {esc(', '.join(summary['devices']))}</p>")
    if summary.get("tuning"):
        out.append(_typed_table(tuning_table(summary["tuning"])))
    out.append(stats_tables(summary["stats"]))
    known = {"study", "description", "scale_down", "devices", "tuning", "stats"}
    for key, value in summary.items():
        if key not in known:
            out.append(generic(value, key, 1))
    return "\n".join(out)


def stats_tables(summary: Mapping[str, Any]) -> str:
    """The tables of a :func:`fathom.stats.summarise_study` output."""
    out = [
        f"<p>Reference recipe: <b>{esc(summary.get('reference'))}</b>; values are mean ± sample SD over seeds.</p>"
    ]
    tables = tables_of(summary) if summary.get("recipes") else {}
    if tables:
        out.append(_typed_table(tables["quality"]))
        out.append(_typed_table(tables["differences"], interactive=True))
        out.append(
            "<ul>"
            + "".join(f"<li>{esc(c.get('sentence', ''))}</li>" for c in summary["comparisons"])
            + "</ul>"
        )
        out.append(_typed_table(tables["timing"]))
    known = {"reference", "recipes", "comparisons", "notes", "level", "target_val_acc"}
    for key, value in summary.items():
        if key not in known:
            out.append(generic(value, key, 1))
    out += [f"<p class='note'>{esc(n)}</p>" for n in summary.get("notes") or []]
    return "\n".join(out)


def provenance_section(run: Any) -> str:
    """Identity, hashes, environment and clocks of one run, from its manifest (the typed
    record; its ``selected``, ``hashes`` and ``environment`` sections shown as written)."""
    m = run.recorded
    ident = [
        ("run", run.run_id),
        ("path", str(run.path)),
        ("study", m.study),
        ("status", m.status),
        ("status reason", m.status_reason),
        ("cohort", run.cohort),
        ("seed", run.seed),
        ("epochs completed", m.epochs_completed),
        ("steps completed", m.steps_completed),
        ("diverged epoch", m.diverged_epoch),
        ("selected", m.selected.as_json() if "selected" in m.given() else None),
        ("history rows", len(run.rows)),
        ("flagged history", "; ".join(run.flag_reasons) or None),
    ]
    hashes = [
        ("config", m.config_hash),
        ("source", m.source_hash),
        ("history.jsonl sha256", run.history_sha256),
        ("split", m.data.split_hash),
        *[(f"params/{k}", v) for k, v in m.hashes.as_json().items()],
        *[(f"data file {k}", v) for k, v in (m.data.files or {}).items()],
    ]
    env = list(m.environment.as_json().items())
    clocks = list((m.clocks or {}).items())
    flag = " <b class='flag'>history flagged</b>" if run.flag_reasons else ""
    return (
        f"<details><summary>{esc(run.run_id)} · {esc(run.cohort)} · seed {esc(run.seed)} · "
        f"{esc(m.status)}{flag}</summary>"
        + table(["identity", "value"], ident)
        + table(["hash", "value"], hashes)
        + table(["environment", "value"], env)
        + table(["clock", "seconds"], clocks)
        + "</details>"
    )


def _checkpoint_records(audit: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(identity, checkpoint record)`` for every audited checkpoint of every run."""
    out = []
    for run in audit.get("runs") or []:
        if not isinstance(run, Mapping):
            continue
        for which, rec in (run.get("checkpoints") or {}).items():
            if isinstance(rec, Mapping):
                ident = {
                    "run": run.get("run_id"),
                    "arm": run.get("arm"),
                    "seed": run.get("seed"),
                    "checkpoint": which,
                    "epoch": rec.get("epoch"),
                }
                out.append((ident, rec))
    return out


# The audit records' leaf fields with a unit: (unit, stored as a fraction, signed).
_AUDIT_UNITS = {
    "acc": ("%", True, False),
    "accuracy": ("%", True, False),
    "error": ("%", True, False),
    "ce": ("nats", False, False),
    "damage": ("nats", False, True),
    "macs_fraction": ("×", False, False),
    "branch_macs_fraction": ("×", False, False),
    "digit": ("%", True, False),
    "contrast raw": ("pp", True, True),
    "contrast standardized": ("pp", True, True),
}


def _with_units(row: Mapping[str, Any]) -> dict[str, Any]:
    """A flattened audit record with every field of :data:`_AUDIT_UNITS` printed in its unit
    (accuracy in percent through :func:`fathom.base.units.percent`) and the unit in its key."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        leaf = key.rsplit(".", 1)[-1]
        rule = _AUDIT_UNITS.get(leaf.split(" ")[0] if leaf.startswith("digit ") else leaf)
        if rule is None or isinstance(value, bool):
            out[key] = value
            continue
        unit, fraction, signed = rule
        label = "× dense" if unit == "×" else unit
        if isinstance(value, int | float):
            shown = percent(value) if fraction else value
            value = fmt_value(shown, unit, signed=signed, suffix=False)
        out[f"{key} ({label})"] = value
    return out


def _record_table(rows: list[dict[str, Any]], caption: str, units: bool = False) -> str:
    """A sortable table of records (``units``: audit records, fields in their units)."""
    rows = [_with_units(r) for r in rows] if units else rows
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    return table(keys, [[r.get(k) for k in keys] for r in rows], interactive=True, caption=caption)


def audit_section(audit: Mapping[str, Any]) -> str:
    """The mask explorer: one sortable, filterable row per (run, checkpoint, mask) with
    accuracy, CE, damage and MACs per split; single-branch deletions; per-digit resilience
    (mean fraction of resilience masks keeping a correctly classified example correct);
    then a link to ``audit.json`` (not inlined: it is most of a page's bytes). An audit of
    another shape is shown whole."""
    records = _checkpoint_records(audit)
    if not records:
        return generic(audit)
    out = []
    masks = [
        {**ident, **flat(m)}
        for ident, rec in records
        for m in rec.get("masks") or []
        if isinstance(m, Mapping)
    ]
    if masks:
        out.append(
            _record_table(
                masks,
                "Every audited mask (1 = branch kept); damage = ΔCE against the full model (nats)",
                units=True,
            )
        )
    branches = [
        {**ident, **flat(b)}
        for ident, rec in records
        for b in rec.get("branches") or []
        if isinstance(b, Mapping)
    ]
    if branches:
        out.append(_record_table(branches, "Single-branch deletions", units=True))
    resilience = []
    for ident, rec in records:
        res = rec.get("resilience")
        if not isinstance(res, Mapping):
            continue
        for split in ("val", "test"):
            part = res.get(split)
            if not isinstance(part, Mapping):
                continue
            row = {**ident, "split": split}
            row.update({f"digit {c}": v for c, v in enumerate(part.get("class_means") or [])})
            row["contrast raw"] = part.get("contrast_raw")
            row["contrast standardized"] = part.get("contrast_standardized")
            resilience.append(row)
    if resilience:
        out.append(
            _record_table(
                resilience,
                "Per-digit resilience: share of resilience masks keeping correct examples correct (%)",
                units=True,
            )
        )
    if audit.get("skipped"):
        out.append(generic(audit["skipped"], "Skipped runs", 1))
    out.append(
        "<p class='note'>Everything else (settings, environment, interactions, routing, speed) "
        f"is in <code>{esc(audit.get('target', 'DIR'))}/audit/audit.json</code> and audit.md "
        "beside it; per-example arrays in the <code>.npz</code> files.</p>"
    )
    return "\n".join(out)


def _probe_text(scope: Any) -> str:
    """``probe: first 128 fit examples`` from a curvature summary's scope mapping."""
    if not isinstance(scope, Mapping):
        return "probe not recorded"
    return f"probe: first {scope.get('N', '?')} {scope.get('split', '?')} examples"


def curvature_section(snapshots: Mapping[str, Any]) -> str:
    """Curvature outputs keyed ``"<run>/<file>"``: each run's ``summary.json`` rows as one
    table (one row per checkpoint epoch), then every snapshot collapsed, shown whole, with
    its eigenvalue lists drawn as spectra."""
    out = []
    for key, value in snapshots.items():
        if (
            key.endswith("/summary.json")
            and isinstance(value, Mapping)
            and isinstance(value.get("rows"), list)
        ):
            rows = [flat(r) for r in value["rows"] if isinstance(r, Mapping)]
            out.append(
                _record_table(
                    rows,
                    f"Curvature summary: run {key.rsplit('/', 1)[0]} ({_probe_text(value.get('scope'))})",
                )
            )
    for key, value in snapshots.items():
        if not key.endswith("/summary.json"):
            out.append(f"<details><summary>{esc(key)}</summary>{generic(value)}</details>")
    return "\n".join(out)
