"""Curvature cross-run tables: traces per recipe and epoch, ratios between recipes, KFAC errors.

Input: ``curvature[run_id] = {"summary": <run>/curvature/summary.json, "epochs": {epoch:
<run>/curvature/epoch-NNNN.json}}`` (as :func:`fathom.report.build.load_curvature` reads
them). Per recipe and epoch, a trace is the mean over the recipe's main runs that have a
snapshot at that epoch (n stated; often one seed). The ratio column is
``trace(recipe) / trace(reference)`` at the same epoch, a ratio of means, in the direction of
every ratio in the report (recipe / reference, as the sentences' paired ratios of
:func:`trace_contrasts` and the telemetry tables' ratios).
A sampled GGN trace (a language model's ``estimator = "mc"``) carries its standard error;
the SE of the mean of ``n`` independent runs' traces is ``sqrt(sum_r SE_r²) / n``.
KFAC diagonal error per layer is ``‖diag(G)⊗diag(A) − diag(GGN)‖₁ / ‖diag(GGN)‖₁``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fathom.base.units import percent
from fathom.report.crosstable import Column, CrossTable, by_recipe, recipe_flags, spread
from fathom.report.runs import RunData
from fathom.stats.contrasts import contrast, contrast_sentence

TRACES = (
    # (field, label with its unit: a parameter unit is the unit of one weight entry)
    ("ggn_weight_trace", "CE-GGN trace (nats / param. unit²)"),
    ("jacobian_gram_weight_trace", "Jacobian-Gram trace (logit² / param. unit²)"),
    ("empirical_fisher_weight_trace", "empirical Fisher trace (nats² / param. unit²)"),
)
_LM_TRACES = (
    # a language model's summary rows (fathom.curvature.rundir): every parameter, biases,
    # LayerNorm gains and the tied embedding included; the loss is nats per token
    ("ggn_trace", "token-CE GGN trace (nats/token / param. unit²)"),
    ("empirical_fisher_trace", "empirical Fisher trace ((nats/token)² / param. unit²)"),
)


def _trace_fields(rows: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
    """The traces the summary rows hold: a classifier's weight traces (:data:`TRACES`), a
    language model's whole-parameter traces (:data:`_LM_TRACES`), or both, in that order."""
    keys = {k for r in rows for k in r}
    lm = tuple(t for t in _LM_TRACES if t[0] in keys)
    return tuple(t for t in TRACES if t[0] in keys) + lm if lm else TRACES


def _estimator_text(row: Mapping[str, Any]) -> str:
    """How a summary row's GGN trace was made, from its own record: ``exact`` (a
    classifier's snapshot, which records no estimator, is exact throughout) or
    ``mc, K samples/window, seed S`` for a sampled one."""
    name = row.get("estimator") or "exact"
    if name == "exact":
        return "exact"
    return f"{name}, {row.get('samples', '?')} samples/window, seed {row.get('seed', '?')}"


def _trace_note(estimators: Sequence[str], lm: bool, reference: str | None) -> str:
    """The trace table's note, its estimator sentence read from the rows' records."""
    what = (
        "Traces of the whole parameter vector (weights, biases, LayerNorm gains, the tied "
        "embedding) under the token cross-entropy, means over the probe's valid positions"
        if lm
        else "Weight diagonals summed over all affine layers (biases excluded), means over "
        "the probe"
    )
    if set(estimators) <= {"exact"}:
        how = "Every trace exact (float64)."
    else:
        how = (
            f"GGN estimator per row as recorded ({'; '.join(dict.fromkeys(estimators))}); a "
            "sampled trace is unbiased, its standard error in the SE column; the empirical "
            "Fisher is exact."
        )
    return (
        f"{how} {what}; per epoch the mean over runs with a snapshot (n). Ratio columns are "
        f"trace(recipe) / trace({reference}) at the same epoch (every ratio in this report is "
        "recipe / reference). CE-GGN curvature can fall while the logit Jacobian grows: these "
        "traces are not interchangeable."
    )


def _rows_by_epoch(curv: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    summary = curv.get("summary") or {}
    return {int(r["epoch"]): r for r in summary.get("rows") or [] if isinstance(r, Mapping)}


def _mean(values: Sequence[float | None]) -> tuple[float | None, int]:
    s = spread(values)
    return (None, 0) if s is None else (s["mean"], s["n"])


def trace_table(
    runs: Sequence[RunData], reference: str | None, curvature: Mapping[str, Mapping[str, Any]]
) -> CrossTable | None:
    """Per recipe and epoch: the traces the rows hold (:func:`_trace_fields`), their ratio
    to the reference's, the GGN estimator as recorded (:func:`_estimator_text`) with the
    standard error of a sampled trace, and the probe's CE and accuracy (a classifier) or
    perplexity (a language model)."""
    groups = by_recipe(runs, reference)
    per = {
        recipe: [_rows_by_epoch(curvature[r.run_id]) for r in rs if r.run_id in curvature]
        for recipe, rs in groups.items()
    }
    per = {k: v for k, v in per.items() if v}
    if not per:
        return None
    every = [row for snaps in per.values() for s in snaps for row in s.values()]
    traces = _trace_fields(every)
    lm = any(key == "ggn_trace" for key, _ in traces)
    estimators = [_estimator_text(row) for row in every]
    cols = [
        Column("recipe", "recipe", "text"),
        Column("epoch", "epoch", "int"),
        Column("n", "runs", "int"),
    ]
    for key, label in traces:
        cols.append(Column(key, label, "num"))
        if key == "ggn_trace" and set(estimators) - {"exact"}:
            cols.append(Column("ggn_trace_se", "GGN trace SE", "num"))
        if reference in per:
            cols.append(Column(f"ratio:{key}", f"recipe / {reference}", "ratio"))
    if lm:
        cols.append(Column("estimator", "GGN estimator", "text"))
    cols.append(
        Column("probe_ce_mean", "probe CE (nats/token)" if lm else "probe CE (nats)", "num", "nats")
    )
    if lm:
        cols.append(Column("probe_ppl", "probe perplexity", "num"))
    if any("probe_accuracy" in row for row in every) or not lm:
        cols.append(Column("probe_accuracy", "probe accuracy (%)", "pct", "%"))
    title = "Curvature traces per recipe and epoch (fixed probe, float64)"
    table = CrossTable("curvature_traces", title, _trace_note(estimators, lm, reference), cols)
    ref_means: dict[tuple[int, str], float | None] = {}
    for recipe, snaps in per.items():
        epochs = sorted({e for s in snaps for e in s})
        for e in epochs:
            hits = [s[e] for s in snaps if e in s]
            row: dict[str, Any] = {"recipe": recipe, "epoch": e, "n": len(hits)}
            for key, _ in traces:
                row[key], _n = _mean([h.get(key) for h in hits])
                if recipe == reference:
                    ref_means[(e, key)] = row[key]
            ses = [h.get("ggn_trace_se") for h in hits]
            if all(x is not None for x in ses) and ses:  # SE of a mean of independent runs
                row["ggn_trace_se"] = sum(x * x for x in ses) ** 0.5 / len(ses)
            row["estimator"] = "; ".join(dict.fromkeys(_estimator_text(h) for h in hits))
            row["probe_ce_mean"], _n = _mean([h.get("probe_ce_mean") for h in hits])
            row["probe_ppl"], _n = _mean([h.get("probe_ppl") for h in hits])
            row["probe_accuracy"], _n = _mean([h.get("probe_accuracy") for h in hits])
            row["probe_accuracy"] = percent(row["probe_accuracy"])
            table.rows.append(row)
    if reference in per:
        for row in table.rows:
            for key, _ in traces:
                ref, own = ref_means.get((row["epoch"], key)), row[key]
                row[f"ratio:{key}"] = None if not ref or own is None else own / ref
    return table


def _kfac_table(
    runs: Sequence[RunData], reference: str | None, curvature: Mapping[str, Mapping[str, Any]]
) -> CrossTable | None:
    groups = by_recipe(runs, reference)
    cells: dict[tuple[str, int], dict[str, list[float | None]]] = {}
    layer_names: list[str] = []
    for recipe, rs in groups.items():
        for r in rs:
            for e, rec in sorted(((curvature.get(r.run_id) or {}).get("epochs") or {}).items()):
                for layer in rec.get("layers") or []:
                    name = str(layer.get("name"))
                    if name not in layer_names:
                        layer_names.append(name)
                    err = (layer.get("kfac") or {}).get("kfac_diag_rel_l1_error")
                    cells.setdefault((recipe, int(e)), {}).setdefault(name, []).append(err)
    if not cells:
        return None
    cols = [Column("recipe", "recipe", "text"), Column("epoch", "epoch", "int")]
    cols += [Column(f"layer:{n}", n, "pct", "%") for n in layer_names]
    table = CrossTable(
        "kfac_errors",
        "KFAC CE-GGN diagonal error per layer (%)",
        "Relative L1 error of the KFAC diagonal diag(G)⊗diag(A) against the exact CE-GGN "
        "diagonal, in percent, mean over runs with a snapshot. Exact factor spectra do not "
        "validate the factorization assumption.",
        cols,
    )
    for (recipe, e), per_layer in cells.items():
        row: dict[str, Any] = {"recipe": recipe, "epoch": e}
        for n in layer_names:
            m, _n = _mean(per_layer.get(n, []))
            row[f"layer:{n}"] = percent(m)
        table.rows.append(row)
    return table


def curvature_tables(
    runs: Sequence[RunData], reference: str | None, curvature: Mapping[str, Mapping[str, Any]]
) -> list[CrossTable | None]:
    return [trace_table(runs, reference, curvature), _kfac_table(runs, reference, curvature)]


def _snapshots_by_seed(
    runs: Sequence[RunData], curvature: Mapping[str, Mapping[str, Any]]
) -> dict[int, dict[int, Mapping[str, Any]]]:
    """``{seed: {epoch: summary row}}`` of the runs with curvature snapshots."""
    return {
        int(r.seed): _rows_by_epoch(curvature[r.run_id])
        for r in runs
        if r.run_id in curvature and r.seed is not None
    }


def trace_contrasts(
    runs: Sequence[RunData], reference: str | None, curvature: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per recipe and trace, at the last epoch it shares with the reference on a common seed:
    the contrast paired over seeds on the log-ratio scale (:func:`fathom.stats.contrast`,
    ``scale="ratio"``)::

        l_s = ln(trace_recipe,s / trace_reference,s),  ratio = exp(mean_s l_s),
        interval = exp(mean(l) ± t · sd(l) / √n)

    a direction only when the interval excludes 1; with n < 2 paired seeds the
    ratio is stated and ``not established`` (one seed has no interval)."""
    groups = by_recipe(runs, reference)
    if reference is None or reference not in groups:
        return []
    ref = _snapshots_by_seed(groups[reference], curvature)
    out = []
    for recipe, rs in groups.items():
        own = _snapshots_by_seed(rs, curvature)
        shared = {e for s, snaps in own.items() if s in ref for e in snaps if e in ref[s]}
        if recipe == reference or not shared:
            continue
        e = max(shared)
        rows = [v[e] for x in (own, ref) for v in x.values() if e in v]
        for key, label in _trace_fields(rows):
            a, b = (
                {s: v[e][key] for s, v in x.items() if v.get(e, {}).get(key) is not None}
                for x in (own, ref)
            )
            if not set(a) & set(b):
                continue
            c = contrast(
                a,
                b,
                scale="ratio",
                flags_a=recipe_flags(rs),
                flags_b=recipe_flags(groups[reference]),
                name_a=recipe,
                name_b=reference,
            )
            sentence = contrast_sentence(
                c, name_a=recipe, name_b=reference, quantity=label.split(" (")[0], epoch=e
            )
            out.append(
                {
                    "recipe": recipe,
                    "reference": reference,
                    "epoch": e,
                    "quantity": key,
                    **c.to_dict(),
                    "sentence": sentence,
                }
            )
    return out
