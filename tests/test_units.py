"""One number formatter per unit (:mod:`fathom.base.units`): each unit's rule, checked against an
independent reading of the printed text, and a scan of ``src/fathom`` for ad-hoc percent
formatting outside ``base/units.py``."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.base.units import (
    UNITS,
    fmt_interval,
    fmt_level,
    fmt_mean_sd,
    fmt_percent,
    fmt_points,
    fmt_spread,
    fmt_value,
    percent,
)
from fathom.stats.numbers import fmt_cell
from fathom.stats.results import Cell

SRC = Path(__file__).resolve().parents[1] / "src" / "fathom"
NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?")
DECIMALS = {"%": 2, "pp": 2, "nats": 4, "s": 2, "ms": 3}
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=200)
@given(x=finite, unit=st.sampled_from(sorted(DECIMALS)), signed=st.booleans())
@example(x=-0.004, unit="%", signed=False)
@example(x=0.0049999, unit="pp", signed=True)
def test_fixed_decimal_units_round_once(x, unit, signed):
    """Every fixed-decimal unit prints ``x`` rounded to its decimals, then its suffix."""
    text = fmt_value(x, unit, signed=signed)
    suffix = {"%": "%", "pp": " pp", "nats": " nats", "s": " s", "ms": " ms"}[unit]
    assert text.endswith(suffix)
    number = text.removesuffix(suffix)
    assert len(number.split(".")[1]) == DECIMALS[unit]
    assert abs(float(number) - x) <= 0.5 * 10 ** -DECIMALS[unit] + 1e-9 * max(1, abs(x))
    assert number.startswith("+") == (signed and not number.startswith("-"))
    assert fmt_value(x, unit, suffix=False) == fmt_value(x, unit).removesuffix(suffix)


@settings(max_examples=100)
@given(x=st.floats(min_value=1e-6, max_value=1e6))
def test_ratio_prints_three_significant_digits(x):
    text = fmt_value(x, "×")
    assert text.endswith("×") and fmt_value(x, "ratio") == text
    assert math.isclose(float(text[:-1]), x, rel_tol=5e-3)


@settings(max_examples=100)
@given(f=st.floats(min_value=0, max_value=1))
def test_accuracy_is_percent_of_the_fraction(f):
    text = fmt_percent(f)
    assert text.endswith("%")
    assert abs(float(text[:-1]) - 100 * f) <= 0.005 + 1e-12
    assert fmt_points(f).endswith(" pp") and fmt_points(f).startswith(("+", "-"))
    assert percent(f) == 100.0 * f


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("unit", UNITS)
def test_undefined_prints_a_dash_never_zero(bad, unit):
    assert fmt_value(bad, unit) == "—"
    assert fmt_mean_sd(bad, 1.0, 3, unit) == "—"


def test_unknown_unit_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="known units"):
        fmt_value(1.0, "furlongs")


def test_mean_sd_and_interval_and_level():
    assert fmt_mean_sd(98.123, 0.456, 3, "%") == "98.12 ± 0.46% (n=3)"
    assert fmt_mean_sd(98.123, 0.456, 3, "%", shown_n=3) == "98.12 ± 0.46%"
    assert fmt_mean_sd(0.05, None, 1, "nats") == "0.0500 nats (n=1)"
    assert fmt_interval(-0.123, 1.0, "pp") == "[-0.12 pp, +1.00 pp]"
    assert fmt_interval(0.9, 1.1, "×", signed=False) == "[0.9×, 1.1×]"
    assert fmt_interval(97.1, 98.0, "%", signed=False) == "[97.10%, 98.00%]"
    assert fmt_level(0.95) == "95%" and fmt_level(0.996875) == "99.69%"
    assert fmt_value(462, "count") == "462"


@settings(max_examples=150)
@given(
    value=st.one_of(st.none(), finite),
    sd=st.one_of(st.none(), st.floats(min_value=0, max_value=1e3)),
    n=st.one_of(st.none(), st.integers(1, 9)),
    unit=st.sampled_from(UNITS[:-2]),
)
def test_a_cell_prints_its_own_numbers(value, sd, n, unit):
    """What :func:`fmt_cell` prints parses back to the cell's value (and SD, n)."""
    text = fmt_cell(Cell(value=value, sd=sd, n=n, unit=unit))
    if value is None:
        assert text == "—"
        return
    nums = [float(x) for x in NUMBER.findall(text.replace("×", ""))]
    tol = 0.5 * 10 ** -DECIMALS.get(unit, 2) + 1e-9 * abs(value)
    if unit in DECIMALS:
        assert abs(nums[0] - value) <= tol
    if sd is not None:
        assert "±" in text
    if n is not None:
        assert text.endswith(f"(n={n})") and nums[-1] == n


# -- the scan: no percent formatting outside fathom/base/units.py --------------------------------

# 1. a ``%`` presentation type in a format spec: f"{x:.1%}", format(x, ".2%")
PERCENT_SPEC = re.compile(
    r"""\{[^{}"']*:[+\- ]?\d*(?:\.\d+)?%\}|format\([^()]*,\s*["'][^"']*%["']\)"""
)
# 2. a multiplication by 100 inside an f-string's replacement field: f"{100 * x:.2f}%"
TIMES_100 = re.compile(r"""f["'][^"']*\{[^{}]*(?:\*\s*100\b|\b100(?:\.0)?\s*\*)[^{}]*\}""")
# 3. a percent given its own rounding: f"{percent(x):.2f}", format(percent(x), ".2f"), f(percent(x), ".2f")
SPEC = r"[+\- ]?\d*(?:\.\d+)?[fgeFGE]"
PERCENT_ROUNDED = re.compile(
    rf"""percent\((?:[^()]|\([^()]*\))*\)\s*(?::{SPEC}\}}|,\s*["']{SPEC}["'])"""
)
# 4. a replacement field printed straight before a literal %: f"({x:.1f}%)", f"{_num(x)}%"
FIELD_THEN_PERCENT = re.compile(r"""f"[^"]*\}%|f'[^']*\}%""")
# a quantile's name (q05 for 0.05) is not a rendered percentage
NOT_A_PERCENT = {("telemetry/field.py", 'f"q{round(q * 100):02d}"')}


def offenders(root: Path = SRC) -> list[str]:
    """``path:line: text`` of every ad-hoc percent formatting outside ``base/units.py``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "base/units.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            for rx in (PERCENT_SPEC, TIMES_100, PERCENT_ROUNDED, FIELD_THEN_PERCENT):
                m = rx.search(line)
                if m and not any(rel == f and s in line for f, s in NOT_A_PERCENT):
                    out.append(f"{rel}:{i}: {line.strip()}")
                    break
    return out


@pytest.mark.parametrize(
    "line",
    [
        'x = f"{acc:.1%}"',
        'x = format(acc, ".2%")',
        'x = f"acc {100 * acc:.2f}%"',
        'x = f"acc {acc * 100:.1f}"',
        "x = f\"{percent(r['acc']):.2f}\"",
        'x = f(percent(r["selected_test_acc"]), ".2f")',
        "x = f\"{per} ({_num(f['mean'])}%)\"",
    ],
)
def test_the_scanner_finds_each_kind(tmp_path, line):
    (tmp_path / "mod.py").write_text(line + "\n")
    assert offenders(tmp_path) == [f"mod.py:1: {line}"]


@pytest.mark.parametrize(
    "line",
    ["x = fmt_percent(acc)", "x = f\"{fmt_value(percent(a), '%')}\"", "x = 100 * a", 'y = "50%"'],
)
def test_the_scanner_passes_the_formatters(tmp_path, line):
    (tmp_path / "mod.py").write_text(line + "\n")
    assert offenders(tmp_path) == []


def test_no_ad_hoc_percent_formatting_outside_units():
    found = offenders()
    assert not found, "format percentages through fathom.base.units:\n" + "\n".join(found)


@settings(max_examples=100)
@given(v=finite)
def test_cross_run_cells_use_the_unit_rules(v):
    """The report's cross-run tables print each column kind by its unit's rule."""
    from fathom.report.render import number

    assert number(v, "pct") == f"{v:.2f}" and number(v, "pp") == f"{v:+.2f}"
    assert number(v, "ratio") == f"{v:.3g}×" and number(v, "num") == f"{v:.4g}"
    assert number(round(v), "int") == str(round(v))


def test_curvature_traces_and_gradient_norms_state_their_units():
    from fathom.report.curvtables import TRACES
    from fathom.report.telemetry_tables import GRADIENT_QUANTITIES

    assert all(re.search(r"\(\S+ / param\. unit²\)$", label) for _, label in TRACES)
    labels = {key: label for key, _, label, _ in GRADIENT_QUANTITIES}
    assert labels["grad_norm"] == "‖mean g‖ (nats / param. unit)"
    assert labels["max_share"].endswith("(%)")


def test_curvature_summary_md_prints_probe_accuracy_in_percent():
    from fathom.curvature.rundir import summary_markdown

    row = {"epoch": 2, "probe_ce_mean": 0.31234, "probe_accuracy": 0.921875,
           "ggn_weight_trace": 12.345678, "runtime_s": 1.5}  # fmt: skip
    md = summary_markdown("r", 128, [row])
    head, _, body = md.strip().splitlines()[-3:]
    cells = dict(zip(head.strip("|").split(" | "), body.strip("|").split(" | ")))
    cells = {k.strip(): v.strip() for k, v in cells.items()}
    assert cells["probe acc (%)"] == "92.19" and cells["probe CE (nats)"] == "0.3123"
    assert cells["GGN tr (nats / param. unit²)"] == "12.35" and cells["runtime (s)"] == "1.50"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=6),
    st.sampled_from(["%", "", "nats"]),
)
def test_the_seed_comparison_spread_reads_back(values, unit):
    """``mean ± sd [min, max] (n=N)``: every printed number is the statistic it names, to
    the unit's own rounding (the reproduction tables' cell, one formatter)."""
    mean, sd = statistics.mean(values), statistics.stdev(values)
    text = fmt_spread(mean, sd, min(values), max(values), len(values), unit)
    m = re.fullmatch(r"(\S+) ± (\S+) \[(\S+), (\S+?)(?:%| nats)?\] \(n=(\d+)\)", text)
    assert m is not None, text
    for printed, true in zip(m.groups()[:4], (mean, sd, min(values), max(values))):
        assert float(printed) == float(fmt_value(true, unit, suffix=False))
    assert int(m.group(5)) == len(values)
    assert fmt_spread(mean, None, None, None, 1, unit) == fmt_value(mean, unit)


def test_a_quoted_seed_value_keeps_its_logged_digits():
    assert fmt_value(2.716, "quoted") == "2.716"
    assert fmt_value(0.9817333, "quoted") == "0.9817333"
    assert fmt_value(2.716, "") == "2.716" and fmt_value(0.98173331, "") == "0.9817"
