"""Every table of the study summary as typed :class:`~fathom.stats.results.Table` objects.

Built once from :func:`fathom.stats.summary.summarise_study`'s numbers (and, for the tuning
table, the study runner's ``tuning`` entry); every renderer (terminal, ``summary.md``, the
report page) prints these cells through :func:`fathom.stats.numbers.fmt_cell` and derives no
number of its own. Cells are in display units: accuracy in percent
(:func:`fathom.base.units.percent` of the stored fraction), its differences in percentage points,
CE in nats, clocks in seconds, ratios as ``×``.

Table ids: ``quality``, ``differences``, ``timing``, ``main`` (the report's headline
table), ``ranking/<metric>`` (the means' ranks), ``pairs/<metric>`` (the pairwise
comparisons of the ranking statement), ``tuning`` (or ``rates`` without a tuning phase).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.base.units import percent
from fathom.stats.results import Cell, Table
from fathom.stats.summary_compare import COMPARED_METRICS

_STAT_UNIT = {"test_acc": "%", "test_ce": "nats", "val_ce": "nats"}
_DIFF_UNIT = {"test_acc": "pp", "test_ce": "nats"}
_METRIC_LABEL = {"test_acc": "accuracy", "test_ce": "CE"}
_MISSING = Cell()


def _text(x: Any) -> Cell:
    return _MISSING if x is None or x == "" else Cell(text=str(x))


def _stat_cell(stat: Mapping[str, Any] | None, unit: str) -> Cell:
    """A summary stat ``{"mean", "sd", "n"}`` as a cell (``%``: the stored fraction in percent)."""
    if not stat or stat.get("mean") is None:
        return _MISSING if not stat else Cell(unit=unit, n=stat.get("n"))
    conv = percent if unit == "%" else float
    sd = None if stat.get("sd") is None else conv(stat["sd"])
    return Cell(value=conv(stat["mean"]), sd=sd, n=stat.get("n"), unit=unit)


def _diff_cell(c: Mapping[str, Any] | None, *, interval: bool = True) -> Cell:
    """A comparison row's paired difference (signed, in pp or nats) with its interval."""
    if not c or not c.get("diff"):
        return _MISSING
    d = c["diff"]
    unit = _DIFF_UNIT[c["metric"]]
    low, high = (d.get("low"), d.get("high")) if interval else (None, None)
    return Cell(value=d["estimate"], low=low, high=high, n=d.get("n"), unit=unit, signed=True)


def _lrs(e: Mapping[str, Any]) -> Cell:
    return _text(", ".join(f"{x:g}" for x in e.get("lr") or []) or None)


def _flags(e: Mapping[str, Any]) -> Cell:
    return _text(", ".join(sorted({f for fl in (e.get("flags") or {}).values() for f in fl})))


def _n(e: Mapping[str, Any]) -> Cell:
    """Seeds behind a recipe's cells (those of its selected test accuracy)."""
    stat = (e.get("selected") or {}).get("test_acc")
    return _MISSING if not stat else Cell(value=stat["n"], unit="count")


def _selected_by(summary: Mapping[str, Any]) -> str:
    """What chose the selected checkpoint: minimum validation CE, or for runs trained with a
    ``[loss]`` table (its keys in the summary's config, which holds the table only when it
    is not the default) that loss's minimum validation value, ``val/loss``
    (:func:`fathom.config.run.objective_field`)."""
    cfg = summary.get("config") or {}
    if "loss.name" not in cfg:
        return "minimum validation CE"
    return f"minimum validation loss: {cfg['loss.name']}, {cfg.get('loss.reduction')}"


def _quality_table(summary: Mapping[str, Any]) -> Table:
    """Per recipe: LR, n, selected and final test accuracy and CE (mean ± sample SD), flags."""
    rows = []
    for name, e in (summary.get("recipes") or {}).items():
        sel, fin = e.get("selected") or {}, e.get("final") or {}
        rows.append(
            [_text(name), _lrs(e), _n(e),
             _stat_cell(sel.get("test_acc"), "%"), _stat_cell(fin.get("test_acc"), "%"),
             _stat_cell(sel.get("test_ce"), "nats"), _stat_cell(fin.get("test_ce"), "nats"),
             _flags(e)]
        )  # fmt: skip
    cols = ["Method", "LR", "n", "Selected test accuracy (%)", "Final test accuracy (%)",
            "Selected test CE (nats)", "Final test CE (nats)", "Flags"]  # fmt: skip
    title = (
        f"Test quality at the selected ({_selected_by(summary)}) and final checkpoints, mean ± "
        f"sample SD over n seeds; reference {summary.get('reference')}"
    )
    return Table(id="quality", title=title, columns=cols, rows=rows, n_column=2)


def _differences_table(summary: Mapping[str, Any]) -> Table:
    """Every paired difference (recipe − reference): estimate, interval at its Holm step's
    level, n, region of no interest, verdict."""
    rows = []
    for c in summary.get("comparisons") or []:
        d = c.get("diff") or {}
        unit = _DIFF_UNIT[c["metric"]]
        verdict = f"{c['verdict']}, fragile" if c.get("fragile") else c["verdict"]
        level = None if d.get("level") is None else percent(d["level"])
        rows.append(
            [_text(c["recipe"]), _text(f"{_METRIC_LABEL[c['metric']]} ({unit})"),
             _text(c["checkpoint"]), _diff_cell(c, interval=False),
             Cell(low=d.get("low"), high=d.get("high"), unit=unit, signed=True),
             Cell(value=level, unit="%"), Cell(value=d.get("n"), unit="count"),
             Cell(value=c.get("smallest_effect"), unit=unit), _text(verdict)]
        )  # fmt: skip
    cols = ["Method", "Test metric (unit)", "Checkpoint", "Difference", "Interval", "Level", "n",
            "Smallest effect of interest (±)", "Verdict"]  # fmt: skip
    title = (
        f"Paired differences (recipe − {summary.get('reference')}) over n paired seeds, each "
        "interval at the level of its Holm step"
    )
    return Table(id="differences", title=title, columns=cols, rows=rows, n_column=6)


def _timing_table(summary: Mapping[str, Any]) -> Table:
    """Fixed-horizon training clock, its ratio of means to the reference, time to target."""
    rows = []
    for name, e in (summary.get("recipes") or {}).items():
        ttt = e.get("time_to_target")
        ratio = (e.get("training_ratio_to_reference") or {}).get("ratio_of_means")
        rows.append(
            [_text(name), _n(e), _stat_cell(e.get("training_s"), "s"), Cell(value=ratio, unit="×"),
             _stat_cell(ttt["training_s"], "s") if ttt else _MISSING,
             _stat_cell(ttt["elapsed_s"], "s") if ttt else _MISSING,
             _text(f"{ttt['reached']}/{ttt['n']}" if ttt else None)]
        )  # fmt: skip
    cols = ["Method", "n", "Fixed-horizon training clock (s)", "Ratio to reference (×)",
            "Time to target, training (s)", "Time to target, elapsed (s)", "Reached"]  # fmt: skip
    return Table(
        id="timing",
        title="Training time (fixed horizon) and time to the validation-accuracy target",
        columns=cols,
        rows=rows,
        n_column=1,
    )


def _main_table(summary: Mapping[str, Any]) -> Table:
    """The report's headline table: per recipe the quality cells and the four paired
    differences against the reference with their intervals."""
    ref = summary.get("reference")
    comps = {
        (c["recipe"], c["metric"], c["checkpoint"]): c for c in summary.get("comparisons") or []
    }
    pairs = [(m, w) for m, _, _ in COMPARED_METRICS for w in ("selected", "final")]
    rows = []
    for qrow, name in zip(_quality_table(summary).rows, summary.get("recipes") or {}):
        diffs = [
            Cell(text="reference") if name == ref else _diff_cell(comps.get((name, m, w)))
            for m, w in pairs
        ]
        rows.append([*qrow[:-1], *diffs, qrow[-1]])
    cols = ["recipe", "LR", "n", "selected acc (%)", "final acc (%)", "selected CE (nats)",
            "final CE (nats)", f"Δ acc selected (pp) vs {ref}", "Δ acc final (pp)",
            "Δ CE selected (nats)", "Δ CE final (nats)", "flags"]  # fmt: skip
    return Table(
        id="main",
        title=f"Test accuracy and CE at the selected ({_selected_by(summary)}) and final "
        "checkpoints",
        columns=cols,
        rows=rows,
        n_column=2,
    )


def _ranking_tables(summary: Mapping[str, Any]) -> list[Table]:
    """Per ranked metric: each recipe's mean at both checkpoints and its rank there."""
    out = []
    for metric, rk in (summary.get("rankings") or {}).items():
        unit = _STAT_UNIT[metric]
        conv = percent if unit == "%" else float
        rows = [
            [_text(r["name"]), Cell(value=conv(r["selected"]), unit=unit),
             Cell(value=r["selected_rank"], unit="count"), Cell(value=conv(r["final"]), unit=unit),
             Cell(value=r["final_rank"], unit="count")]
            for r in rk["rows"]
        ]  # fmt: skip
        out.append(
            Table(
                id=f"ranking/{metric}",
                title=f"Recipe means by {rk['label']} ({unit}) at the selected and final checkpoints",
                columns=[
                    "Method",
                    f"Selected ({unit})",
                    "Rank (selected)",
                    f"Final ({unit})",
                    "Rank (final)",
                ],
                rows=rows,
            )
        )
    return out


def _pairs_tables(summary: Mapping[str, Any]) -> list[Table]:
    """Per ranked metric: every pairwise comparison (``a − b``) the ranking statement rests
    on (:mod:`fathom.stats.ranking`), at both checkpoints."""
    out = []
    for metric, rk in (summary.get("rankings") or {}).items():
        unit = _DIFF_UNIT[metric]
        rows = []
        for p in rk.get("pairs") or []:
            d = p.get("diff") or {}
            verdict = f"{p['verdict']}, fragile" if p.get("fragile") else p["verdict"]
            level = None if d.get("level") is None else percent(d["level"])
            rows.append(
                [_text(p["a"]), _text(p["b"]), _text(p["checkpoint"]),
                 Cell(value=d.get("estimate"), unit=unit, signed=True),
                 Cell(low=d.get("low"), high=d.get("high"), unit=unit, signed=True),
                 Cell(value=level, unit="%"), Cell(value=d.get("n"), unit="count"),
                 _text(verdict)]
            )  # fmt: skip
        out.append(
            Table(
                id=f"pairs/{metric}",
                title=f"Pairwise differences by {rk['label']} (a − b, {unit})",
                columns=["a", "b", "Checkpoint", "Difference", "Interval", "Level", "n",
                         "Verdict"],
                rows=rows,
                n_column=6,
            )
        )  # fmt: skip
    return out


def summary_tables(summary: Mapping[str, Any]) -> list[Table]:
    """Every table of a :func:`~fathom.stats.summary.summarise_study` output, in print order."""
    return [
        _quality_table(summary),
        _differences_table(summary),
        _timing_table(summary),
        _main_table(summary),
        *_ranking_tables(summary),
        *_pairs_tables(summary),
    ]


def tables_of(summary: Mapping[str, Any]) -> dict[str, Table]:
    """The summary's tables by id: those stored in ``summary["results"]["tables"]``, or (a
    summary written before they were stored) built from its numbers now."""
    stored = ((summary.get("results") or {}).get("tables")) or []
    tables = [Table.model_validate(t) for t in stored] or summary_tables(summary)
    return {t.id: t for t in tables}


def tuning_table(tuning: Mapping[str, Any]) -> Table:
    """The study's learning-rate selection: the tuning grid (rate, status, minimum
    validation CE and its epoch, divergence, the selected rate) or, without a tuning phase,
    each recipe's rate and where it came from."""
    chosen = tuning.get("selected_lr") or {}
    if not tuning.get("enabled"):
        sources = tuning.get("lr_source") or {}
        rows = [
            [_text(r), _text(f"{lr:g}"), _text(sources.get(r, "study.lr"))]
            for r, lr in chosen.items()
        ]
        return Table(id="rates", title=f"No tuning phase: {tuning.get('rule')}",
                     columns=["Method", "LR", "Source"], rows=rows)  # fmt: skip
    grid = tuning.get("grid") or []
    # a grid ranked by a [loss] table's loss (its points say objective "val/loss") shows it
    by_loss = any(p.get("objective") == "val/loss" for p in grid)
    key, unit, head = (
        ("val_loss", "", "Min validation loss") if by_loss
        else ("val_ce", "nats", "Min validation CE (nats)")
    )  # fmt: skip
    rows = [
        [_text(p["recipe"]), _text(f"{p['lr']:g}"), _text(p["status"]),
         Cell(value=p.get(key), unit=unit), Cell(value=p.get("selected_epoch"), unit="count"),
         Cell(value=p.get("diverged_epoch"), unit="count"),
         _text("selected" if chosen.get(p["recipe"]) == p["lr"] else None)]
        for p in grid
    ]  # fmt: skip
    cols = ["Method", "LR", "Status", head, "At epoch", "Diverged in epoch",
            "Selected"]  # fmt: skip
    title = f"Tuning grid (seed {tuning.get('seed')}); selection: {tuning.get('rule')}"
    return Table(id="tuning", title=title, columns=cols, rows=rows)
