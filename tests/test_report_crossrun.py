"""Cross-run tables against hand-computed values on a tiny synthetic study."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from fathom.report import load_runs
from fathom.report.crossrun import crossrun_tables
from fathom.report.crosstable import layer_fields
from fathom.report.render import table_markdown
from synthetic_runs import write_run


def _rows(seed_offset: float, head: str) -> list[dict]:
    base = {"epoch": 0, "fit/acc": 0.5, "fit/ce": 1.0, "test/acc": 0.5}
    last = {
        "epoch": 2,
        "fit/acc": 0.9 + seed_offset,
        "fit/ce": 0.2 + seed_offset,
        "test/acc": 0.8 + seed_offset,
        "split/test/class_acc/0": 0.7 + seed_offset,
        "split/test/class_acc/1": 0.9,
        f"grad/pex/diversity/{head}": 10.0 + 100 * seed_offset,
        f"grad/mean/weight_norm/{head}": 1.0,
        f"grad/pex/max_share/{head}": 0.5,
        f"grad/pex/participation/{head}": 2.0,
        "probe/act/zero_frac/blocks.0": 0.25 + seed_offset,
    }
    return [base, {"epoch": 1, "fit/acc": 0.7}, last]


@pytest.fixture()
def study(tmp_path: Path) -> Path:
    root = tmp_path / "s"
    # residual seeds: offsets 0.00, 0.02; sd_constant seeds: 0.04, 0.10
    for recipe, offs in (("residual", (0.0, 0.02)), ("sd_constant", (0.04, 0.10))):
        for seed, off in zip((1, 2), offs):
            write_run(
                root / f"{recipe}-s{seed}",
                study="s",
                recipe=recipe,
                seed=seed,
                lr=0.1,
                rows=_rows(off, "head"),
            )
    write_run(
        root / "tune-residual-lr0.1-s9",
        study="s",
        recipe="residual",
        seed=9,
        lr=0.1,
        rows=_rows(0.5, "head"),
        phase="tuning",
    )
    return root


def test_tables_hand_computed(study: Path) -> None:
    tables = {t.name: t for t in crossrun_tables(load_runs(study), "residual")}
    fit = {r["recipe"]: r for r in tables["fitting"].rows}
    # residual fit/acc 0.90, 0.92 -> 91.0 %, min 90, max 92; the tuning run is left out
    assert fit["residual"]["fit_acc"]["mean"] == pytest.approx(91.0)
    assert (fit["residual"]["fit_acc"]["min"], fit["residual"]["fit_acc"]["max"]) == pytest.approx(
        (90.0, 92.0)
    )
    assert fit["sd_constant"]["fit_ce"]["mean"] == pytest.approx((0.24 + 0.30) / 2)
    assert fit["residual"]["fit_acc"]["sd"] == pytest.approx(2**0.5)  # sample SD of 90, 92
    digits = tables["digits_test"].rows[0]
    # digit 0: sd (0.74, 0.80) - residual (0.70, 0.72) = +4, +8 pp -> mean +6 pp
    assert digits["recipe"] == "sd_constant" and digits["digit:0"] == pytest.approx(6.0)
    assert digits["digit:1"] == pytest.approx(0.0) and digits["overall"] == pytest.approx(6.0)
    assert digits["intervals"]["digit:0"]["n"] == 2
    grad = [r for r in tables["gradients"].rows if r["recipe"] == "sd_constant"]
    assert [r["epoch"] for r in grad] == [2]  # only the epoch the moments were recorded
    assert grad[0]["diversity"]["mean"] == pytest.approx(17.0)  # (14 + 20) / 2
    assert tables["gradients"].title.endswith("(head)")
    zero = {r["recipe"]: r for r in tables["zero_activations"].rows}
    assert zero["sd_constant"]["layer:0"]["mean"] == pytest.approx(32.0)  # (29 + 35) / 2
    assert tables["zero_activations"].columns[3].label == "→ blocks.0 (%)"
    md = table_markdown(tables["fitting"])
    assert "| residual | 2 | 2 | 91.00 (90.00–92.00) |" in md


def test_layer_fields_order() -> None:
    names = ["x/L10", "x/L2", "x/L0", "x/sub/L1", "y/L0"]
    assert layer_fields(names, "x") == [("L0", "x/L0"), ("L2", "x/L2"), ("L10", "x/L10")]
    mods = ["g/blocks.1", "g/blocks.0", "g/head"]
    assert layer_fields(mods, "g") == [
        ("blocks.1", "g/blocks.1"),
        ("blocks.0", "g/blocks.0"),
        ("head", "g/head"),
    ]


def test_scale_down_statement_is_the_computed_one(study: Path) -> None:
    from fathom.report.sections import what_was_run

    runs = load_runs(study)
    computed = "Scaled down from the full protocol (preset ciresan-sd): 2 epochs instead of 100."
    html = what_was_run({"scale_down_sentence": computed, "scale_down": ["x"]}, runs)
    assert computed in html and "not computed" not in html
    legacy = what_was_run({"scale_down": ["widths x 0.1"]}, runs)
    assert "not computed" in legacy and "widths x 0.1" in legacy
    assert "2 main runs" not in legacy and "<b>4</b> main runs" in legacy  # tuning run apart


def test_units_one_conversion() -> None:
    from fathom.units import fmt_percent, fmt_points, percent

    assert percent(0.9863) == pytest.approx(98.63) and percent(None) is None
    assert fmt_percent(0.98634) == "98.63%" and fmt_percent(float("nan")) == "—"
    assert fmt_points(-0.0057) == "-0.57 pp" and fmt_points(None) == "—"


def test_zero_activations_align_layers_by_position(study: Path) -> None:
    rows = _rows(0.0, "head")
    rows[-1]["probe/act/zero_frac/blocks.0.res"] = rows[-1].pop("probe/act/zero_frac/blocks.0")
    layers = ["stem", "blocks.0.res", "head"]
    write_run(
        study / "plain-s1", study="s", recipe="plain", seed=1, lr=0.1, rows=rows, layers=layers
    )
    # Without a manifest layer list the residual runs are matched by name only: two columns (listed layers first).
    table = next(
        t for t in crossrun_tables(load_runs(study), "residual") if t.name == "zero_activations"
    )
    assert [c.label for c in table.columns[3:]] == ["→ blocks.0.res (%)", "→ blocks.0 (%)"]
    # With the manifests' layer lists, position 1 is one layer: one column, residual first.
    for recipe, offs in (("residual", (0.0, 0.02)), ("sd_constant", (0.04, 0.10))):
        for seed, off in zip((1, 2), offs):
            write_run(study / f"{recipe}-s{seed}", study="s", recipe=recipe, seed=seed, lr=0.1,
                      rows=_rows(off, "head"), layers=["stem", "blocks.0", "head"])  # fmt: skip
    table = next(
        t for t in crossrun_tables(load_runs(study), "residual") if t.name == "zero_activations"
    )
    assert [c.label for c in table.columns[3:]] == ["→ blocks.0 / blocks.0.res (%)"]
    plain = next(r for r in table.rows if r["recipe"] == "plain")
    assert plain["layer:0"]["mean"] == pytest.approx(25.0) and plain["n"] == 1


T2 = 4.302652729749462  # t_{0.975, 2 dof}


def _tel_rows(recipe_names: list[str], norm: float, zero: float) -> list[dict]:
    """Epochs 0 and 5; the head's ‖mean g‖ and the zero fraction into block 0 at epoch 5."""
    block, head = recipe_names[1], recipe_names[-1]
    last = {
        "epoch": 5,
        "fit/acc": 0.95,
        "fit/ce": 0.2,
        "test/acc": 0.9,
        f"grad/mean/weight_norm/{head}": norm,
        f"grad/pex/diversity/{head}": 10.0,
        f"grad/pex/max_share/{head}": 0.5,
        f"grad/pex/participation/{head}": 2.0,
        f"probe/act/zero_frac/{block}": zero,
        f"probe/act/zero_frac/{head}": zero,
    }
    first = {**last, "epoch": 0}
    return [first, last]


def _aligned_study(root: Path, statuses: dict[tuple[str, int], str] | None = None) -> Path:
    res = ["stem", "blocks.0.res.branch", "head"]
    plain = ["stem", "blocks.0.res", "head"]
    values = {  # (recipe, seed) -> (head ‖mean g‖, zero fraction into block 0)
        ("residual", 1): (1.0, 0.10), ("residual", 2): (2.0, 0.11), ("residual", 3): (2.0, 0.12),
        ("plain", 1): (0.5, 0.30), ("plain", 2): (0.9, 0.32), ("plain", 3): (1.1, 0.35),
        ("sd_constant", 1): (0.7, 0.2),
    }  # fmt: skip
    for (recipe, seed), (norm, zero) in values.items():
        names = plain if recipe == "plain" else res
        write_run(
            root / f"{recipe}-s{seed}", study="s", recipe=recipe, seed=seed, lr=0.1,
            rows=_tel_rows(names, norm, zero), layers=names,
            status=(statuses or {}).get((recipe, seed), "complete"),
        )  # fmt: skip
    return root


def _verdict(table, recipe: str, quantity: str, epoch: int = 5, layer: str | None = None):
    return next(
        v
        for v in table.verdicts
        if v["recipe"] == recipe and v["quantity"] == quantity and v["epoch"] == epoch
        and (layer is None or v["layer"] == layer)
    )  # fmt: skip


def test_telemetry_contrasts_hand_computed(tmp_path: Path) -> None:
    tables = {
        t.name: t for t in crossrun_tables(load_runs(_aligned_study(tmp_path / "s")), "residual")
    }
    grad = tables["gradients"]
    v = _verdict(grad, "plain", "grad_norm")
    # ratios plain / residual per seed: 0.5, 0.45, 0.55 -> geometric mean and t interval on logs
    logs = [math.log(r) for r in (0.5, 0.45, 0.55)]
    m = sum(logs) / 3
    # the table's contrasts are one Holm family: the interval is read at its step's level
    t_q = scipy_stats.t.ppf((1 + v["level"]) / 2, 2)
    assert v["comparison"]["family_size"] > 1 and v["level"] >= 0.95
    half = t_q * math.sqrt(sum((x - m) ** 2 for x in logs) / 2) / math.sqrt(3)
    assert v["verdict"] == "lower" and v["n"] == 3 and v["scale"] == "ratio"
    assert (v["estimate"], v["low"], v["high"]) == pytest.approx(
        (math.exp(m), math.exp(m - half), math.exp(m + half)), rel=1e-12
    )
    assert v["sentence"].startswith(
        f"plain vs residual on head-layer ‖mean g‖ (epoch 5): lower (ratio {math.exp(m):.3g}×, "
        f"{100 * v['level']:.4g}% interval [{math.exp(m - half):.3g}×, {math.exp(m + half):.3g}×], "
        "paired over n=3 seeds"
    )
    plain_row = next(r for r in grad.rows if r["recipe"] == "plain" and r["epoch"] == 5)
    assert plain_row["max_share"]["mean"] == pytest.approx(50.0)  # 0.5 in percent
    # equal diversity in every seed: ratio exactly 1, inside the region of no interest
    assert _verdict(grad, "plain", "diversity")["verdict"] == "equivalent"
    # one sd_constant seed against three reference seeds: unequal seeds, no comparison
    one = _verdict(grad, "sd_constant", "grad_norm")
    assert one["verdict"] == "no comparison" and one["low"] is None
    assert "unequal seeds" in one["sentence"]
    # zero activations: plain's blocks.0.res and residual's blocks.0.res.branch in one column
    zero = tables["zero_activations"]
    assert [c.label for c in zero.columns[3:]] == [
        "→ blocks.0.res.branch / blocks.0.res (%)",
        "→ head (%)",
    ]
    plain = next(r for r in zero.rows if r["recipe"] == "plain")
    assert plain["layer:0"]["mean"] == pytest.approx((30 + 32 + 35) / 3)
    z = _verdict(zero, "plain", "zero_frac", layer="blocks.0.res.branch / blocks.0.res")
    d = [20.0, 21.0, 23.0]  # pp
    t_q = scipy_stats.t.ppf((1 + z["level"]) / 2, 2)
    half = t_q * math.sqrt(sum((x - 64 / 3) ** 2 for x in d) / 2) / math.sqrt(3)
    assert z["verdict"] == "higher"
    assert (z["estimate"], z["low"], z["high"]) == pytest.approx(
        (64 / 3, 64 / 3 - half, 64 / 3 + half)
    )
    md = table_markdown(zero)
    assert f"- {z['sentence']}" in md
    assert (
        "zero-activation fraction into blocks.0.res.branch / blocks.0.res (epoch 5): higher" in md
    )


def test_telemetry_contrasts_refuse_diverged_arms(tmp_path: Path) -> None:
    root = _aligned_study(tmp_path / "s", {("plain", 3): "diverged"})
    tables = {t.name: t for t in crossrun_tables(load_runs(root), "residual")}
    for name, quantity in (("gradients", "grad_norm"), ("zero_activations", "zero_frac")):
        v = _verdict(tables[name], "plain", quantity)
        assert v["verdict"] == "no comparison" and v["estimate"] is None
        assert "no comparison (plain excluded (diverged))" in v["sentence"]
    # the seeds' spreads are still shown; the other recipes are still compared
    assert "unequal seeds" in _verdict(tables["gradients"], "sd_constant", "grad_norm")["reason"]


def test_gradient_table_reads_each_recipes_own_head(tmp_path: Path) -> None:
    # a recipe whose output layer is named "fc": the head is found by position, not name
    root = _aligned_study(tmp_path / "s")
    names = ["stem", "blocks.0.res", "fc"]
    for seed, norm in ((1, 0.5), (2, 0.9), (3, 1.1)):
        write_run(root / f"plain-s{seed}", study="s", recipe="plain", seed=seed, lr=0.1,
                  rows=_tel_rows(names, norm, 0.3), layers=names)  # fmt: skip
    grad = next(t for t in crossrun_tables(load_runs(root), "residual") if t.name == "gradients")
    assert grad.title.endswith("(head / fc)")
    plain = [r for r in grad.rows if r["recipe"] == "plain"]
    assert [r["epoch"] for r in plain] == [0, 5]
    assert plain[1]["grad_norm"]["mean"] == pytest.approx((0.5 + 0.9 + 1.1) / 3)
    assert _verdict(grad, "plain", "grad_norm")["verdict"] == "lower"
