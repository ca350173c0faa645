"""Curvature trace sentences carry their numbers: a paired contrast over seeds on the
log-ratio scale with its t interval (brute-force reference here), "not established (n = 1)"
from one seed, never a bare "1.61× lower"."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from fathom.report.curvtables import TRACES, trace_contrasts, trace_table
from fathom.report.runs import RunData
from fathom.stats.rules import DEFAULT_RULES


def _run(recipe: str, seed: int) -> RunData:
    manifest = {
        "status": "complete",
        "phase": "main",
        "config": {"model": {"recipe": recipe}, "seed": seed},
        "data": {"info": {"classes": 10}, "sizes": {"test": 5000}},
    }
    rows = [{"epoch": 5, "test/acc": 0.9, "fit/ce": 0.1, "fit/acc": 0.95}]
    return RunData(Path(f"/x/{recipe}-{seed}"), f"main-{recipe}-s{seed}", manifest, rows)


def _curvature(traces: dict[str, float]) -> dict:
    return {"summary": {"rows": [{"epoch": 0, **traces}, {"epoch": 5, **traces}]}, "epochs": {}}


def _study(pairs: list[tuple[float, float]]):
    """Runs of ``sd`` and ``residual`` for seeds 101.., every trace of seed s = pairs[s]."""
    runs, curvature = [], {}
    for i, (a, b) in enumerate(pairs):
        for recipe, v in (("sd", a), ("residual", b)):
            r = _run(recipe, 101 + i)
            runs.append(r)
            curvature[r.run_id] = _curvature({k: v for k, _ in TRACES})
    return runs, curvature


positive = st.floats(0.01, 1000.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(pairs=st.lists(st.tuples(positive, positive), min_size=1, max_size=5))
@example(pairs=[(1.0, 1.61)])  # the old "1.61× lower" from one seed
@example(pairs=[(1.0, 2.0), (1.2, 2.0), (0.9, 2.0)])  # established: lower
def test_trace_sentences_are_paired_log_ratio_contrasts(pairs):
    runs, curvature = _study(pairs)
    out = trace_contrasts(runs, "residual", curvature)
    assert [c["quantity"] for c in out] == [k for k, _ in TRACES]
    logs = [math.log(a / b) for a, b in pairs]
    n = len(logs)
    for c in out:
        assert c["epoch"] == 5 and c["n"] == n
        assert math.isclose(c["estimate"], math.exp(sum(logs) / n), rel_tol=1e-9)
        s = c["sentence"]
        assert "× lower" not in s and "× higher" not in s  # never a bare "1.61× lower"
        if n < 2:
            assert c["verdict"] == "not established" and c["low"] is None
            assert "not established" in s and "n=1 paired seed" in s and "no interval" in s
            assert f"{c['estimate']:.3g}" in s
            continue
        # the engine's rule (docs/statistics.md): t part, resolution floor, smallest effect
        m = sum(logs) / n
        sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (n - 1))
        floor = math.sqrt(n * DEFAULT_RULES.log_ratio_resolution**2) / n
        half = max(sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n), sps.norm.ppf(0.975) * floor)
        assert math.isclose(c["low"], math.exp(m - half), rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(c["high"], math.exp(m + half), rel_tol=1e-9, abs_tol=1e-12)
        delta = DEFAULT_RULES.log_ratio
        if m - half > delta:
            assert c["verdict"] == "higher" and " higher" in s
        elif m + half < -delta:
            assert c["verdict"] == "lower" and " lower" in s
        elif -delta < m - half and m + half < delta:
            assert c["verdict"] == "equivalent"
        else:
            assert c["verdict"] == "not established" and "not established" in s


def test_no_reference_or_no_shared_seed_gives_no_sentence():
    runs, curvature = _study([(1.0, 2.0)])
    assert trace_contrasts(runs, None, curvature) == []
    assert trace_contrasts(runs, "absent", curvature) == []
    only_sd = {k: v for k, v in curvature.items() if "-sd-" in k}
    assert trace_contrasts(runs, "residual", only_sd) == []


@settings(max_examples=30, deadline=None)
@given(pairs=st.lists(st.tuples(positive, positive), min_size=1, max_size=4))
def test_table_ratios_run_recipe_over_reference_as_the_sentences(pairs):
    """The table's ratio column is trace(recipe) / trace(reference), a ratio of seed means
    (float64 reference here), in the direction of the sentences' paired ratio: with one
    seed the two are the same number."""
    runs, curvature = _study(pairs)
    table = trace_table(runs, "residual", curvature)
    assert table is not None
    labels = {c.key: c.label for c in table.columns}
    for key, _ in TRACES:
        assert labels[f"ratio:{key}"] == "recipe / residual"
    sd_mean = math.fsum(a for a, _ in pairs) / len(pairs)
    ref_mean = math.fsum(b for _, b in pairs) / len(pairs)
    for row in table.rows:
        want = 1.0 if row["recipe"] == "residual" else sd_mean / ref_mean
        for key, _ in TRACES:
            assert math.isclose(row[f"ratio:{key}"], want, rel_tol=1e-12)
    if len(pairs) == 1:
        for c in trace_contrasts(runs, "residual", curvature):
            assert math.isclose(c["estimate"], pairs[0][0] / pairs[0][1], rel_tol=1e-9)
