"""Units in ``audit.md`` and in the report's collapsed audit tables: accuracy and error rates
in percent, their changes and tolerances in percentage points, CE and damage in nats,
fractions of the dense network as ratios; never a bare fraction beside a % column."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from fathom.audit.report import to_markdown
from fathom.report.raw import audit_section
from fathom.units import percent
from page_tables import html_tables
from synthetic_runs import write_study

RUNS = ["residual-s101", "residual-s102", "sd_constant-s101", "sd_constant-s102"]
PCT = re.compile(r"^[+-]?\d+\.\d{2}%$")


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> dict:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from synthetic_audit import write_audit

    root = tmp_path_factory.mktemp("units") / "study"
    write_study(root, recipes=("residual", "sd_constant"), seeds=(101, 102), layers=4)
    result = copy.deepcopy(write_audit(root, RUNS, examples=200))
    _add_routing(result)
    return result


def _iv(estimate: float, spread: float, n: int = 2) -> dict:
    return {"estimate": estimate, "low": estimate - spread, "high": estimate + spread, "n": n}


def _add_routing(result: dict) -> None:
    """A router record and its across-seed summary (the fields ``audit.md`` prints), with
    accuracies, errors and tolerances as the router stores them: fractions."""
    rec = result["runs"][0]["checkpoints"]["selected"]
    timing = {"routed_over_dense": 0.83, "routed_over_dense_iqr": [0.8, 0.9], "repeats": 3,
              "examples": 64, "batch_size": 8, "device": "cpu",
              "dense_over_routed": {"median": 1.2, "q1": 1.1, "q3": 1.25, "repeats": 3,
                                    "verdict": "faster"}}  # fmt: skip
    rec["routing"] = {
        "tree": {"depth": 3, "leaves": 5},
        "test": {
            "accuracy": 0.9512,
            "error_increase": 0.0031,
            "tolerance": 0.01,
            "tolerance_held": True,
            "cost_fraction": 0.62,
        },
        "control": {"verdict": "router vs random control: not established"},
        "static": {"mask": "1011", "test": {"accuracy": 0.9498, "tolerance_held": False}},
        "timing": timing,
    }
    for which in result["aggregate"]:
        for arm in result["aggregate"][which]["arms"].values():
            arm["routing"] = {
                "tolerance_held": 1, "static_tolerance_held": 0, "runs": 2,
                "test_accuracy": _iv(0.9511, 0.004), "test_cost_fraction": _iv(0.61, 0.02),
                "control_accuracy": _iv(0.9402, 0.006), "routed_over_dense_time": _iv(0.84, 0.03),
                "runs_beating_control": 1, "sentence": "router vs control: not established.",
            }  # fmt: skip


def _md_tables(md: str) -> list[tuple[list[str], list[list[str]]]]:
    out, lines = [], md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and not lines[i - 1].startswith("|"):
            rows = []
            for row in lines[i:]:
                if not row.startswith("|"):
                    break
                if not row.startswith("|---"):
                    rows.append([c.strip() for c in row.strip("|").split(" | ")])
            out.append((rows[0], rows[1:]))
    return out


def test_audit_md_prints_every_accuracy_in_percent(audit):
    md = to_markdown(audit)
    tables = _md_tables(md)
    acc_cells = damage_cells = 0
    for header, rows in tables:
        for j, name in enumerate(header):
            for row in rows:
                cell = row[j]
                if cell == "—":
                    continue
                numbers = re.findall(r"[+-]?\d+\.\d+\S*", cell)
                if "acc (%)" in name:
                    acc_cells += 1
                    assert all(PCT.match(x.rstrip(",]")) for x in numbers), (name, cell)
                if "(nats)" in name:
                    damage_cells += 1
                    assert cell.replace(",", "").count(" nats") == len(numbers), (name, cell)
    assert acc_cells > 50 and damage_cells > 50
    # sentences: every accuracy, error increase and tolerance carries its unit
    for m in re.finditer(r"(accuracy|error increase|tolerance) ([+-]?\d[\d.]*)(\S*)", md):
        assert m.group(3).startswith(("%", " pp")) or md[m.end(2) :].startswith(" pp"), m.group(0)
    assert "test error increase +0.31 pp (tolerance 1.00 pp: held)" in md
    assert "test accuracy 95.12%" in md and "accuracy 95.11% [94.71%, 95.51%] (n=2)" in md
    assert "speed-up 1.2× (IQR 1.1×–1.25× over 3 repeats)" in md
    assert not re.search(r"(accuracy|tolerance) 0\.\d", md)


def test_audit_md_mask_rows_hold_the_records_numbers(audit):
    md = to_markdown(audit)
    run = audit["runs"][0]
    rec = run["checkpoints"]["final"]
    section = md.split(f"### `{run['run_id']}` ({run['arm']}, seed {run['seed']}), final")[1]
    header, rows = _md_tables(section)[0]
    for m in rec["masks"]:
        row = next(r for r in rows if r[0] == f"`{m['mask']}`")
        shown = float(row[header.index("test acc (%)")].rstrip("%"))
        assert abs(shown - percent(m["test"]["acc"])) <= 0.005 + 1e-9
        damage = float(row[header.index("test damage (nats)")].removesuffix(" nats"))
        assert abs(damage - m["test"]["damage"]) <= 5e-5 + 1e-12


def test_collapsed_audit_tables_in_the_report_are_in_percent(audit):
    tables = html_tables(audit_section(audit))
    masks = next(rows for cap, rows in tables.items() if cap.startswith("Every audited mask"))
    header = masks[0]
    assert "test.acc (%)" in header and "val.acc (%)" in header and "test.damage (nats)" in header
    assert not any(h.endswith(".acc") for h in header)
    col = header.index("test.acc (%)")
    recs = [m for r in audit["runs"] for c in r["checkpoints"].values() for m in c["masks"]]
    for row, m in zip(masks[1:], recs):
        assert abs(float(row[col]) - percent(m["test"]["acc"])) <= 0.005 + 1e-9
    resilience = next(rows for cap, rows in tables.items() if cap.startswith("Per-digit"))
    assert any(h.startswith("digit 0 (%)") for h in resilience[0])
    assert "contrast raw (pp)" in resilience[0]


def test_the_fixture_is_a_real_audit(audit):
    assert Path(audit["target"]).name == "study"
    assert len(audit["runs"]) == len(RUNS)


def test_report_audit_headline_tables_in_percent_and_nats(audit):
    from fathom.report.audit_view import audit_headline

    tables = html_tables(audit_headline(audit))
    acc = next(rows for cap, rows in tables.items() if cap.startswith("Test accuracy (%)"))
    damage = next(rows for cap, rows in tables.items() if cap.startswith("Damage ΔCE (nats)"))
    agg = audit["aggregate"]
    for rows, key in ((acc, "test_acc"), (damage, "test_damage")):
        sizes = [h.removesuffix(" kept") for h in rows[0][2:]]
        for row in rows[1:]:
            by = agg[row[1]]["arms"][row[0]]["by_size"]
            for size, cell in zip(sizes, row[2:]):
                iv = by[size][key]
                want = percent(iv["estimate"]) if key == "test_acc" else iv["estimate"]
                shown = float(cell.split(" ")[0])
                assert abs(shown - want) <= (0.005 if key == "test_acc" else 5e-5) + 1e-12
                assert not cell.startswith("0.") or key != "test_acc", cell
