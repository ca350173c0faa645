"""The report's raw sections: the study summary's every table, provenance per run, every
audited mask and checkpoint, and the curvature snapshots; collapsed on the page.

Built from :mod:`fathom.report.tables`' primitives; any key these functions do not know
is still shown through :func:`fathom.report.tables.generic`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fathom.report.tables import esc, flat, generic, table
from fathom.stats.units import percent


def _ms(stat: Mapping[str, Any] | None, scale: Callable[[float], float] = float) -> str:
    """``mean ± SD (n=…)`` of a summary statistic; ``scale`` converts units (e.g. to percent)."""
    if not stat or stat.get("mean") is None:
        return "—"
    text = f"{scale(stat['mean']):.4g}"
    if stat.get("sd") is not None:
        text += f" ± {scale(stat['sd']):.2g}"
    return f"{text} (n={stat.get('n')})"


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
    tuning = summary.get("tuning") or {}
    if tuning.get("enabled"):
        chosen = tuning.get("selected_lr") or {}
        rows = [
            [
                p.get("recipe"),
                p.get("lr"),
                p.get("status"),
                p.get("val_ce"),
                p.get("selected_epoch"),
                p.get("diverged_epoch"),
                "selected" if chosen.get(p.get("recipe")) == p.get("lr") else None,
            ]
            for p in tuning.get("grid") or []
        ]
        out.append(
            table(
                ["method", "LR", "status", "min val CE", "epoch", "diverged in epoch", "selected"],
                rows,
                caption=f"Tuning grid (seed {tuning.get('seed')}): {tuning.get('rule', '')}",
            )
        )
    out.append(stats_tables(summary["stats"]))
    known = {"study", "description", "scale_down", "devices", "tuning", "stats"}
    for key, value in summary.items():
        if key not in known:
            out.append(generic(value, key, 1))
    return "\n".join(out)


def _recipe_table(recipes: Mapping[str, Any]) -> str:
    rows = []
    for name, e in recipes.items():
        flags = sorted({f for fl in (e.get("flags") or {}).values() for f in fl})
        rows.append(
            [
                name,
                ", ".join(f"{x:g}" for x in e.get("lr") or []) or None,
                _ms((e.get("selected") or {}).get("test_acc"), percent),
                _ms((e.get("final") or {}).get("test_acc"), percent),
                _ms((e.get("selected") or {}).get("test_ce")),
                _ms((e.get("final") or {}).get("test_ce")),
                ", ".join(flags) or None,
            ]
        )
    head = ["method", "LR", "selected test acc (%)", "final test acc (%)",
            "selected test CE (nats)", "final test CE (nats)", "flags"]  # fmt: skip
    return table(head, rows, caption="Selected (minimum validation CE) and final checkpoints")


def _comparison_table(comps: Sequence[Mapping[str, Any]], reference: Any) -> str:
    rows = []
    for c in comps:
        d = c.get("diff") or {}
        interval = None if d.get("low") is None else f"[{d['low']:+.4g}, {d['high']:+.4g}]"
        metric = f"{c.get('metric')} ({c['unit']})" if c.get("unit") else c.get("metric")
        rows.append(
            [c.get("recipe"), metric, c.get("checkpoint"), d.get("estimate"), interval,
             d.get("n"), c.get("verdict")]
        )  # fmt: skip
    head = ["method", "metric (unit)", "checkpoint", "difference", "interval", "n", "verdict"]
    return (
        table(head, rows, interactive=True, caption=f"Paired differences against {reference}")
        + "\n<ul>"
        + "".join(f"<li>{esc(c.get('sentence', ''))}</li>" for c in comps)
        + "</ul>"
    )


def _time_table(recipes: Mapping[str, Any], target: Any) -> str:
    rows = []
    for name, e in recipes.items():
        ttt = e.get("time_to_target") or {}
        ratio = (e.get("training_ratio_to_reference") or {}).get("ratio_of_means")
        rows.append(
            [
                name,
                _ms(e.get("training_s")),
                ratio,
                _ms(ttt.get("training_s")) if ttt else None,
                _ms(ttt.get("elapsed_s")) if ttt else None,
                f"{ttt['reached']}/{ttt['n']}" if ttt else None,
            ]
        )
    head = ["method", "training clock (s)", "ratio to reference", "time to target, training (s)",
            "time to target, elapsed (s)", "reached"]  # fmt: skip
    return table(head, rows, caption=f"Time (target validation accuracy {target})")


def stats_tables(summary: Mapping[str, Any]) -> str:
    """The tables of a :func:`fathom.stats.summarise_study` output."""
    out = [
        f"<p>Reference recipe: <b>{esc(summary.get('reference'))}</b>; values are mean ± sample SD over seeds.</p>"
    ]
    recipes = summary.get("recipes") or {}
    if recipes:
        out.append(_recipe_table(recipes))
    comps = summary.get("comparisons") or []
    if comps:
        out.append(_comparison_table(comps, summary.get("reference")))
    if recipes:
        out.append(_time_table(recipes, summary.get("target_val_acc")))
    known = {"reference", "recipes", "comparisons", "notes", "level", "target_val_acc"}
    for key, value in summary.items():
        if key not in known:
            out.append(generic(value, key, 1))
    out += [f"<p class='note'>{esc(n)}</p>" for n in summary.get("notes") or []]
    return "\n".join(out)


def provenance_section(run: Any) -> str:
    """Identity, hashes, environment and clocks of one run, straight from its manifest."""
    m = run.manifest
    data = m.get("data") or {}
    ident = [
        ("run", run.run_id),
        ("path", str(run.path)),
        ("study", m.get("study")),
        ("status", m.get("status")),
        ("status reason", m.get("status_reason")),
        ("cohort", run.cohort),
        ("seed", run.seed),
        ("epochs completed", m.get("epochs_completed")),
        ("steps completed", m.get("steps_completed")),
        ("diverged epoch", m.get("diverged_epoch")),
        ("selected", m.get("selected")),
        ("history rows", len(run.rows)),
        ("flagged history", "; ".join(run.flag_reasons) or None),
    ]
    hashes = [
        ("config", m.get("config_hash")),
        ("source", m.get("source_hash")),
        ("history.jsonl sha256", run.history_sha256),
        ("split", data.get("split_hash")),
        *[(f"params/{k}", v) for k, v in (m.get("hashes") or {}).items()],
        *[(f"data file {k}", v) for k, v in (data.get("files") or {}).items()],
    ]
    env = list((m.get("environment") or {}).items())
    clocks = list((m.get("clocks") or {}).items())
    flag = " <b class='flag'>history flagged</b>" if run.flag_reasons else ""
    return (
        f"<details><summary>{esc(run.run_id)} · {esc(run.cohort)} · seed {esc(run.seed)} · "
        f"{esc(m.get('status'))}{flag}</summary>"
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


def _record_table(rows: list[dict[str, Any]], caption: str) -> str:
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
            )
        )
    branches = [
        {**ident, **flat(b)}
        for ident, rec in records
        for b in rec.get("branches") or []
        if isinstance(b, Mapping)
    ]
    if branches:
        out.append(_record_table(branches, "Single-branch deletions"))
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
                "Per-digit resilience: fraction of resilience masks keeping correct examples correct",
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
