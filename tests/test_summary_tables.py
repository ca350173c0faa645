"""One source: the study summary's typed tables (``summary["results"]["tables"]``) are what
``summary.md``, the report page (raw study tables and the headline table) and the terminal
show, and their cells hold the records' own numbers (a float64 brute-force reference)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from fathom.report.raw import stats_tables
from fathom.report.sections import main_table
from fathom.stats.numbers import table_text
from fathom.stats.results import Table
from fathom.stats.summary import RunRecord, summarise_study
from fathom.stats.summary_md import to_markdown
from fathom.stats.summary_tables import summary_tables, tables_of, tuning_table
from fathom.study.markdown import tuning_markdown
from fathom.study.report import print_summary
from page_tables import html_tables, md_tables

RECIPES = ("residual", "plain", "residual_dropout", "sd_constant", "sd_decreasing")
NUMBER = re.compile(r"[+-]?\d+\.\d+|[+-]?\d+")


def _record(recipe: str, seed: int, acc: float, ce: float, status: str = "complete") -> RunRecord:
    curve = [(0, 0.0, 0.0, 0.1), (1, 2.0, 3.0, acc - 0.01), (2, 4.0, 6.0, acc)]
    return RunRecord(
        recipe=recipe,
        seed=seed,
        lr=0.05,
        status=status,
        classes=10,
        selected={"test_acc": acc, "test_ce": ce, "val_ce": ce, "epoch": 2},
        final={"test_acc": acc - 0.002, "test_ce": ce + 0.01, "val_ce": ce, "epoch": 2},
        fit_acc_final=0.99,
        training_clock_s=5.0 + seed % 7,
        elapsed_s=8.0 + seed % 5,
        curve=curve,
        config_fingerprint={"dataset": "mnist", "epochs": 2},
        fit_ce_final=0.05,
        n_test=2000,
    )


@st.composite
def studies(draw):
    """Quick-study-like records: 2–5 recipes × 2–4 seeds, accuracies 85–99%, CE 0.03–0.5
    nats, now and then a diverged run (NaN)."""
    k = draw(st.integers(2, 5))
    seeds = list(range(101, 101 + draw(st.integers(2, 4))))
    recs = []
    for recipe in RECIPES[:k]:
        for s in seeds:
            acc = draw(st.floats(0.85, 0.99))
            ce = draw(st.floats(0.03, 0.5))
            diverged = recipe != RECIPES[0] and draw(st.integers(0, 9)) == 0
            recs.append(_record(recipe, s, math.nan if diverged else acc, ce,
                                "diverged" if diverged else "complete"))  # fmt: skip
    return recs


QUICK = [
    _record(r, s, 0.90 + 0.01 * i + 0.003 * (s % 3), 0.3 - 0.02 * i + 0.001 * s % 4)
    for i, r in enumerate(RECIPES)
    for s in (101, 102, 103)
]


def _check_numbers(t: Table, texts: list[list[str]]) -> None:
    """Each printed number reads back to its cell's value within half its last digit."""
    for cells, row in zip(t.rows, texts):
        for c, text in zip(cells, row):
            if c.text is not None or c.value is None:
                continue
            first = NUMBER.search(text.replace("×", ""))
            assert first, (t.id, text)
            digits = len(first.group().split(".")[1]) if "." in first.group() else 0
            tol = 0.5 * 10**-digits if c.unit not in ("×", "") else abs(c.value) * 5e-3
            assert abs(float(first.group()) - c.value) <= tol + 1e-12, (t.id, text, c)


def _reference_quality(records, t: Table) -> None:
    """Quality cells against numpy (float64, ddof=1) over each recipe's usable runs."""
    by = {}
    for r in records:
        by.setdefault(r.recipe, []).append(r)
    for row in t.rows:
        runs = [r for r in by[row[0].text] if r.status == "complete"]
        for col, where, key, scale in (
            (3, "selected", "test_acc", 100.0),
            (4, "final", "test_acc", 100.0),
            (5, "selected", "test_ce", 1.0),
        ):
            xs = np.array([getattr(r, where)[key] for r in runs], dtype=np.float64) * scale
            if len(xs) == 0:
                assert row[col].value is None
                continue
            assert math.isclose(row[col].value, xs.mean(), rel_tol=1e-12)
            assert row[col].n == len(xs)
            if len(xs) > 1:
                assert math.isclose(row[col].sd, xs.std(ddof=1), rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=12, deadline=None)
@given(records=studies())
@example(records=QUICK)
def test_every_output_shows_the_typed_tables(records):
    s = json.loads(json.dumps(summarise_study(records, reference="residual", target_val_acc=0.9)))
    tables = tables_of(s)
    # the stored tables are the ones built from the summary's numbers, and hold the records'
    assert [t.model_dump() for t in summary_tables(s)] == s["results"]["tables"]
    _reference_quality(records, tables["quality"])
    # summary.md: each table's rows are the cells' text
    md = md_tables(to_markdown(s))
    for tid in ("quality", "differences", "timing"):
        t = tables[tid]
        assert md[t.title][0] == t.columns
        assert md[t.title][1:] == table_text(t)
        _check_numbers(t, md[t.title][1:])
    for metric, rk in s["rankings"].items():  # the ranking statement's tables
        shown = [f"pairs/{metric}"] if rk.get("claim") else []
        shown += [f"ranking/{metric}"] if rk.get("claim") and rk["disagree"] else []
        for tid in shown:
            assert md[tables[tid].title][1:] == table_text(tables[tid])
            _check_numbers(tables[tid], md[tables[tid].title][1:])
    # the report page: raw study tables and the headline table
    page = html_tables(stats_tables(s) + main_table(s))
    for tid in ("quality", "differences", "timing", "main"):
        t = tables[tid]
        assert page[t.title][0] == t.columns
        assert page[t.title][1:] == table_text(t)
        _check_numbers(t, page[t.title][1:])
    # the terminal: each quality row's cells, unit in the header
    text = _terminal(s)
    for row in table_text(tables["quality"], suffix=False):
        line = next(x for x in text.splitlines() if x.startswith(row[0] + " "))
        assert all(cell in line for cell in row[3:5]), (row, line)


def _terminal(stats: dict) -> str:
    console = Console(width=80, record=True, color_system=None)
    tuning = {"enabled": False, "rule": "every recipe at study.lr", "selected_lr": {}}
    summary = {"study": "t", "devices": ["cpu"], "tuning": tuning, "stats": stats}
    print_summary(summary, console)
    return console.export_text()


def test_an_older_summary_without_stored_tables_renders_the_same():
    s = summarise_study(QUICK, reference="residual", target_val_acc=0.9)
    older = {**s, "results": {k: v for k, v in s["results"].items() if k != "tables"}}
    assert to_markdown(older) == to_markdown(s)
    assert main_table(older) == main_table(s)


def test_tuning_table_is_the_grid_markdown_and_html_show():
    tuning = {
        "enabled": True,
        "seed": 1,
        "rule": "minimum validation CE",
        "grid": [
            {
                "recipe": "residual",
                "lr": 0.05,
                "status": "complete",
                "val_ce": 0.12345,
                "selected_epoch": 2,
                "diverged_epoch": None,
            },
            {
                "recipe": "residual",
                "lr": 1e6,
                "status": "diverged",
                "val_ce": None,
                "selected_epoch": None,
                "diverged_epoch": 1,
            },
        ],
        "selected_lr": {"residual": 0.05},
    }
    t = tuning_table(tuning)
    assert table_text(t) == [
        ["residual", "0.05", "complete", "0.1235 nats", "2", "—", "selected"],
        ["residual", "1e+06", "diverged", "—", "—", "1", "—"],
    ]
    md = md_tables("\n".join(["", *tuning_markdown({"tuning": tuning})]))
    assert md[t.title][1:] == table_text(t)


def test_summary_md_unit_columns_hold_only_their_unit():
    """Every non-empty cell under a ``(%)`` header prints a percentage, under ``(nats)``
    nats, under ``(s)`` seconds; no bare fraction beside a % column."""
    s = summarise_study(QUICK, reference="residual", target_val_acc=0.9)
    suffix = {"(%)": "%", "(nats)": " nats", "(s)": " s", "(×)": "×"}
    seen = 0
    for rows in md_tables(to_markdown(s)).values():
        for j, head in enumerate(rows[0]):
            unit = next((u for h, u in suffix.items() if head.endswith(h)), None)
            for row in rows[1:]:
                if unit is None or row[j] == "—":
                    continue
                seen += 1
                body = re.sub(r" \(n=\d+\)$", "", row[j])
                assert body.endswith(unit), (head, row[j])
                assert not re.fullmatch(r"0\.\d+", body.split(" ")[0]) or unit != "%", row[j]
    assert seen >= 4 * len(RECIPES)


def test_summary_md_states_the_target_in_percent():
    md = to_markdown(summarise_study(QUICK, reference="residual", target_val_acc=0.9))
    assert "validation accuracy >= 90.00%" in md
    assert not re.search(r"accuracy >= 0\.\d", md)
