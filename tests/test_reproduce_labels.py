"""``reproduction.md`` tells the truth about every label: the seed's epoch and Fathom's on each
row, a count over its own denominator (compared as a rate), the head collapse per digit
computed from the counts, the within-range check on every row, and (seed 000) depths in
numeric order, λ̂ labelled another definition, the accuracy definitions in the Markdown.

Rendered from small synthetic pipeline states (no training): curvature summaries, a head
pair's per-class counts and depth-scaling run records built here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.depthscale.table import BASELINE, CANDIDATE, RunRecord, build_table
from fathom.reproduce.compare import compare_row, comparison
from fathom.reproduce.compare_md import range_cell, to_markdown
from fathom.reproduce.depth_compare import depth_comparison
from fathom.reproduce.depth_render import to_markdown as depth_markdown
from fathom.reproduce.extract import Measured, Sources
from fathom.reproduce.seeds import load_seeds

SEEDS = load_seeds()
RECIPES = ("residual", "sd_constant", "sd_decreasing")
FIELDS = (
    "ggn_weight_trace",
    "jacobian_gram_weight_trace",
    "empirical_fisher_weight_trace",
    "kfac_diag_rel_l1_error_max",
)
SEED_EPOCHS = (0, 1, 5, 10, 100)


def _value(recipe: str, epoch: int, field: str) -> float:
    """A distinct positive value per recipe, snapshot epoch and field."""
    return 1.0 + RECIPES.index(recipe) + 10.0 * epoch + 0.1 * FIELDS.index(field)


def _head(relu: list[int], linear: list[int], totals: list[int], epochs: int) -> dict:
    def arm(correct: list[int]) -> dict:
        return {
            "epoch": epochs,
            "accuracy": sum(correct) / sum(totals),
            "per_class": [
                {"digit": d, "correct": c, "total": t}
                for d, (c, t) in enumerate(zip(correct, totals, strict=True))
            ],
        }

    return {"seed": 104, "epochs": epochs, "heads": {"relu": arm(relu), "linear": arm(linear)}}


def _sources(root: Path, epoch_map: dict[int, int], head: dict | None) -> Sources:
    curvature = {
        (r, 101): {
            e: {"epoch": e, **{f: _value(r, e, f) for f in FIELDS}}
            for e in sorted(set(epoch_map.values()))
        }
        for r in RECIPES
    }
    return Sources(
        root=root,
        summary={"runs": {}, "study": "synthetic", "scale_down": ["widths x 0.1"]},
        audit=None,
        curvature=curvature,
        head=head,
        epoch_map=epoch_map,
        _runs=[],
    )


def _render(root: Path, epoch_map: dict[int, int], head: dict | None) -> tuple[dict, str]:
    result = comparison(SEEDS, _sources(root, epoch_map, head), pipeline="t", locations={})
    return result, to_markdown(result)


def _cells(md: str, quantity: str) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith(f"| {quantity} |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def _heading(md: str, title_start: str) -> str:
    return next(x for x in md.splitlines() if x.startswith(f"## {title_start}"))


snapshot_epochs = st.lists(st.integers(0, 400), min_size=5, max_size=5, unique=True).map(sorted)


@settings(max_examples=15, deadline=None)
@given(epochs=snapshot_epochs)
@example(epochs=[0, 1, 2, 3, 5])  # the quick pipeline: seed epochs 5 and 100 are its 2 and 5
def test_every_curvature_row_states_the_seed_epoch_and_fathoms(tmp_path_factory, epochs):
    epoch_map = dict(zip(SEED_EPOCHS, epochs, strict=True))
    result, md = _render(tmp_path_factory.mktemp("c"), epoch_map, None)
    rows = [r for r in result["rows"] if r["table"] == "curvature"]
    assert len(rows) == 12
    for r in rows:
        seed_epoch = int(SEEDS_BY_ID[r["id"]].extract["epoch"])
        cells = _cells(md, r["quantity"])
        assert cells[2] == f"{seed_epoch} → {epoch_map[seed_epoch]}", (r["id"], cells)
        ex = SEEDS_BY_ID[r["id"]].extract
        if ex["kind"] == "curvature":  # the value is the snapshot's at the mapped epoch
            want = _value(ex["recipe"], epoch_map[seed_epoch], ex["field"])
            assert r["fathom"]["mean"] == want
    heading = _heading(md, "Offline curvature trajectories")
    for seed_epoch in (0, 5, 100):
        assert f"seed epoch {seed_epoch} → Fathom epoch {epoch_map[seed_epoch]}" in heading


SEEDS_BY_ID = {v.id: v for v in SEEDS.value}
counts = st.integers(1, 60).flatmap(
    lambda t: st.tuples(st.just(t), st.integers(0, t), st.integers(0, t))
)


@settings(max_examples=25, deadline=None)
@given(cells=st.lists(counts, min_size=10, max_size=10), epochs=st.integers(1, 9))
@example(  # the quick study's pair: digit 1 collapsed under the ReLU head, digit 6 did not
    cells=[
        (460, 432, 436),
        (571, 0, 563),
        (530, 476, 458),
        (500, 444, 447),
        (500, 470, 470),
        (456, 415, 397),
        (462, 430, 427),
        (512, 409, 417),
        (489, 409, 427),
        (520, 460, 460),
    ],
    epochs=2,
)
def test_head_rows_use_their_own_denominators_and_say_where_the_collapse_reproduced(
    tmp_path_factory, cells, epochs
):
    totals, relu, linear = (list(c) for c in zip(*cells, strict=True))
    head = _head(relu, linear, totals, epochs)
    result, md = _render(tmp_path_factory.mktemp("h"), {0: 0}, head)
    rows = {r["id"]: r for r in result["rows"]}
    for arm, correct in (("relu", relu), ("linear", linear)):
        r = rows[f"head.{arm}.sixes_correct"]
        seed = SEEDS_BY_ID[r["id"]]
        want = 100 * correct[6] / totals[6] - 100 * float(seed.value) / 958
        assert abs(r["difference"] - want) < 1e-9  # rates, never counts of two totals
        c = _cells(md, r["quantity"])
        assert c[2] == f"5 → {epochs}"
        assert c[3].startswith(f"{seed.value:g}/958 (") and c[4].startswith(
            f"{correct[6]}/{totals[6]} ("
        )
        assert c[5] == f"{want:+.2f} pp (rates)"
    assert "(of 958)" not in md
    heading = _heading(md, "Head diagnostic")
    assert f"seed epoch 5 → Fathom epoch {epochs}" in heading
    bullets = [x[2:] for x in md.splitlines() if x.startswith("- Digit ")]
    six = next(b for b in bullets if b.startswith("Digit 6:"))
    assert ("did not reproduce" in six) == (relu[6] > 0)
    assert "0/958" in six and f"{relu[6]}/{totals[6]}" in six
    for d in range(10):
        said = [b for b in bullets if b.startswith(f"Digit {d}:") and " did reproduce" in b]
        assert bool(said) == (relu[d] == 0), (d, bullets)
    if all(c > 0 for c in relu):
        assert "- Fathom's ReLU head collapsed on no digit." in md


values = st.floats(-50, 150, allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(seed_value=values, fathom=st.lists(values, min_size=1, max_size=5))
@example(seed_value=98.5, fathom=[98.1, 98.5])  # on the edge of the range
def test_within_range_is_shown_on_every_row_scaled_down_or_not(seed_value, fathom):
    base = SEEDS_BY_ID["quality.residual.selected_acc"]
    seed = base.model_copy(update={"value": seed_value})
    per_seed = {101 + i: v for i, v in enumerate(fathom)}
    extract = {"study": lambda src, ex: Measured(per_seed, epochs=dict.fromkeys(per_seed, 4))}
    for comparable in (None, "scaled-down run (see scale_down)"):
        row = compare_row(seed, SEEDS, None, comparable, extract)
        cell = range_cell(row)
        if len(fathom) < 2:
            assert cell == f"— (n = {len(fathom)}: no range)"
        elif min(fathom) <= seed_value <= max(fathom):
            assert cell == "yes"
        else:
            side = "above" if seed_value > max(fathom) else "below"
            assert cell == f"no (seed {side})"


def _records(depths: list[int]) -> list[RunRecord]:
    return [
        RunRecord(
            depth=d,
            arm=arm,
            seed=s,
            status="complete",
            test_acc=0.3 + 0.01 * d + 0.02 * s + (0.05 if arm == CANDIDATE else 0.0),
            fit_ce=1.0,
            fit_acc=0.5,
            lyapunov=0.1 * d,
            grad_norm=1.0,
            kappa=10.0,
            selected_epoch=1,
        )
        for d in depths
        for arm in (BASELINE, CANDIDATE)
        for s in (0, 1)
    ]


def test_seed_000_markdown_orders_depths_labels_lambda_and_states_the_accuracy_definitions():
    depths = [4, 8, 12, 16, 20]
    table = build_table(_records(depths), classes=100, dataset="cifar100")
    result = depth_comparison(
        SEEDS,
        table,
        pipeline="t",
        reductions=["epochs 1 (protocol: 150)"],
        counterpart="table.md",
        devices=["cpu"],
        fit_sizes=[40000],
    )
    result = json.loads(json.dumps(result, sort_keys=True))  # as reproduction.json reads back
    md = depth_markdown(result)
    order = [int(m) for m in re.findall(r"^- depth (\d+): ", md, flags=re.M)]
    assert order == depths
    lam = [x for x in md.splitlines() if x.startswith("| ") and "| λ̂ |" in x]
    assert len(lam) == 5 and all("not comparable (another definition)" in x for x in lam)
    defs = md.split("## Definitions", 1)[1].split("\n## ", 1)[0]
    acc = next(x for x in defs.splitlines() if x.startswith("- acc (%):"))
    assert "last epoch's (150)" in acc and "50,000" in acc and "validation-selected" in acc
    assert "fit on 40,000 training images" in defs
