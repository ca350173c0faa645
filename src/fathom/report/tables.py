"""HTML tables (and small inline SVG spectra) for study summaries, audits, curvature, provenance.

Rendered once in Python: these sections are static, so the page script only sorts and
filters them. Any JSON the report does not know field by field (a future audit or
curvature key) is still shown, by :func:`generic`: scalars as key/value rows, lists of
records as sortable, filterable tables, long lists of numbers as spectra.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from itertools import count
from typing import Any

_ids = count()


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def headline_table(
    tid: str, caption: str, head: list[str], rows: list[list[str]], label_columns: int = 1
) -> str:
    """A headline ``<table>``: escaped cells, the columns after the first ``label_columns``
    right-aligned as numbers (class ``num``)."""
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='{'num' if i >= label_columns else ''}'>{esc(c)}</td>"
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return (
        f"<table class='headline' id='{tid}'><caption>{esc(caption)}</caption><thead><tr>"
        + "".join(f"<th>{esc(h)}</th>" for h in head)
        + f"</tr></thead><tbody>{body}</tbody></table>"
    )


def cell(v: Any) -> str:
    """A value as table text: ``—`` for null, 6 significant digits for floats, JSON otherwise."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else str(v)
    if isinstance(v, int | str):
        return str(v)
    text = json.dumps(v, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    interactive: bool = False,
    caption: str | None = None,
) -> str:
    """An HTML table; ``interactive`` adds click-to-sort headers and a text filter."""
    tid = f"t{next(_ids)}"
    parts = []
    if interactive:
        parts.append(
            f'<input class="table-filter" data-table="{tid}" placeholder="filter rows..." '
            f'aria-label="filter rows of table {tid}">'
        )
    cls = "sortable" if interactive else ""
    parts.append(f'<table id="{tid}" class="{cls}">')
    if caption:
        parts.append(f"<caption>{esc(caption)}</caption>")
    parts.append("<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr></thead>")
    parts.append("<tbody>")
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{esc(cell(v))}</td>" for v in row) + "</tr>")
    parts.append("</tbody></table>")
    return "\n".join(parts)


def spectrum_svg(values: Sequence[float], title: str) -> str:
    """Sorted (descending) values against their rank; log10 axis when all are positive."""
    ys = sorted(
        (float(v) for v in values if v is not None and math.isfinite(float(v))), reverse=True
    )
    if not ys:
        return f"<p>{esc(title)}: no finite values</p>"
    log = all(y > 0 for y in ys)
    t = [math.log10(y) for y in ys] if log else ys
    lo, hi = min(t), max(t)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    w, h, pad = 360, 160, 30
    n = max(len(t) - 1, 1)
    pts = " ".join(
        f"{pad + i / n * (w - pad - 6):.1f},{6 + (1 - (v - lo) / (hi - lo)) * (h - pad - 6):.1f}"
        for i, v in enumerate(t)
    )
    scale = "log10 scale" if log else "linear scale"
    return (
        f'<figure class="spectrum"><svg viewBox="0 0 {w} {h}" width="{w}" height="{h}">'
        f'<rect x="{pad}" y="6" width="{w - pad - 6}" height="{h - pad - 6}" class="frame"/>'
        f'<polyline points="{pts}" fill="none" stroke="#1f77b4"/>'
        f'<text x="{pad}" y="{h - 8}">rank 1..{len(ys)}</text>'
        f'<text x="2" y="14">{ys[0]:.3g}</text><text x="2" y="{h - pad}">{ys[-1]:.3g}</text>'
        f"</svg><figcaption>{esc(title)} ({len(ys)} values, {scale})</figcaption></figure>"
    )


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, bool | int | float | str)


def _is_numbers(v: Any) -> bool:
    return (
        isinstance(v, list)
        and len(v) > 0
        and all(x is None or (isinstance(x, int | float) and not isinstance(x, bool)) for x in v)
    )


def flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings flattened to dotted keys (``{"val": {"acc": 1}} -> {"val.acc": 1}``);
    values that are neither mappings nor scalars (lists) are dropped."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat(v, key + "."))
        elif _is_scalar(v):
            out[key] = v
    return out


def _has_lists(v: Any) -> bool:
    if isinstance(v, Mapping):
        return any(_has_lists(x) for x in v.values())
    return isinstance(v, list)


def _label(item: Mapping[str, Any], i: int) -> str:
    for key in ("run_id", "name", "id", "mask", "recipe", "arm", "epoch", "checkpoint"):
        if key in item and _is_scalar(item[key]):
            return f"{key} {item[key]}"
    return f"item {i}"


def generic(obj: Any, title: str = "", depth: int = 0) -> str:
    """Render arbitrary JSON: see the module docstring."""
    head = f"<h{min(3 + depth, 6)}>{esc(title)}</h{min(3 + depth, 6)}>" if title else ""
    if _is_scalar(obj):
        return f"{head}<p>{esc(cell(obj))}</p>"
    if _is_numbers(obj):
        if len(obj) >= 8:
            return head + spectrum_svg(obj, title or "values")
        return f"{head}<p>{esc(cell(obj))}</p>"
    if isinstance(obj, list):
        if obj and all(isinstance(x, Mapping) for x in obj):
            flats = [flat(x) for x in obj]
            keys: list[str] = []
            for x in flats:
                keys += [k for k in x if k not in keys]
            out = [
                head,
                table(keys, [[x.get(k) for k in keys] for x in flats], interactive=len(obj) > 5),
            ]
            if depth < 8:
                out += [
                    f"<details><summary>{esc(_label(x, i))}: nested tables</summary>{generic(x, '', depth + 1)}</details>"
                    for i, x in enumerate(obj)
                    if _has_lists(x)
                ]
            return "\n".join(out)
        return f"{head}<p>{esc(cell(obj))}</p>"
    if (
        isinstance(obj, Mapping)
        and len(obj) > 1
        and all(
            isinstance(v, Mapping) and all(_is_scalar(x) for x in v.values()) for v in obj.values()
        )
    ):
        keys = []
        for v in obj.values():
            keys += [k for k in v if k not in keys]
        rows = [[k, *(v.get(c) for c in keys)] for k, v in obj.items()]
        return head + table(["key", *keys], rows, interactive=len(rows) > 5)
    if isinstance(obj, Mapping):
        scalars = [
            (k, v) for k, v in obj.items() if _is_scalar(v) or (_is_numbers(v) and len(v) < 8)
        ]
        others = [
            (k, v) for k, v in obj.items() if not (_is_scalar(v) or (_is_numbers(v) and len(v) < 8))
        ]
        out = [head]
        if scalars:
            out.append(table(["key", "value"], scalars))
        if depth >= 8:
            out += [f"<p>{esc(k)}: {esc(cell(v))}</p>" for k, v in others]
            return "\n".join(out)
        for k, v in others:
            if _is_numbers(v):
                out.append(spectrum_svg(v, str(k)))
            else:
                out.append(
                    f"<details open><summary>{esc(k)}</summary>{generic(v, '', depth + 1)}</details>"
                )
        return "\n".join(out)
    return f"{head}<p>{esc(cell(obj))}</p>"


def _ms(stat: Mapping[str, Any] | None) -> str:
    if not stat or stat.get("mean") is None:
        return "—"
    text = f"{stat['mean']:.4g}"
    if stat.get("sd") is not None:
        text += f" ± {stat['sd']:.2g}"
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


def stats_tables(summary: Mapping[str, Any]) -> str:
    """The tables of a :func:`fathom.stats.summarise_study` output."""
    out = [
        f"<p>Reference recipe: <b>{esc(summary.get('reference'))}</b>; values are mean ± sample SD over seeds.</p>"
    ]
    recipes = summary.get("recipes") or {}
    if recipes:
        rows = []
        for name, e in recipes.items():
            flags = sorted({f for fl in (e.get("flags") or {}).values() for f in fl})
            rows.append(
                [
                    name,
                    ", ".join(f"{x:g}" for x in e.get("lr") or []) or None,
                    _ms((e.get("selected") or {}).get("test_acc")),
                    _ms((e.get("final") or {}).get("test_acc")),
                    _ms((e.get("selected") or {}).get("test_ce")),
                    _ms((e.get("final") or {}).get("test_ce")),
                    ", ".join(flags) or None,
                ]
            )
        out.append(
            table(
                [
                    "method",
                    "LR",
                    "selected test acc",
                    "final test acc",
                    "selected test CE",
                    "final test CE",
                    "flags",
                ],
                rows,
                caption="Selected (minimum validation CE) and final checkpoints",
            )
        )
    comps = summary.get("comparisons") or []
    if comps:
        rows = []
        for c in comps:
            d = c.get("diff") or {}
            interval = None if d.get("low") is None else f"[{d['low']:+.4g}, {d['high']:+.4g}]"
            rows.append(
                [
                    c.get("recipe"),
                    c.get("metric"),
                    c.get("checkpoint"),
                    d.get("estimate"),
                    interval,
                    d.get("n"),
                    c.get("verdict"),
                ]
            )
        out.append(
            table(
                ["method", "metric", "checkpoint", "difference", "interval", "n", "verdict"],
                rows,
                interactive=True,
                caption=f"Paired differences against {summary.get('reference')}",
            )
        )
        out.append(
            "<ul>" + "".join(f"<li>{esc(c.get('sentence', ''))}</li>" for c in comps) + "</ul>"
        )
    if recipes:
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
        target = summary.get("target_val_acc")
        out.append(
            table(
                [
                    "method",
                    "training clock (s)",
                    "ratio to reference",
                    "time to target, training (s)",
                    "time to target, elapsed (s)",
                    "reached",
                ],
                rows,
                caption=f"Time (target validation accuracy {target})",
            )
        )
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
