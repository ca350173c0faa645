"""The seeds' reference data (every value quoted, sourced, with units) and the verdicts of the
comparison on adversarial cases: within, above, below, one run, scaled down, other hardware,
missing counterpart."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fathom.errors import FathomError
from fathom.reproduce.compare import spread, verdict
from fathom.reproduce.extract import Measured
from fathom.reproduce.seeds import SeedValue, load_seeds, parse_seeds

# the seed reports live in shared/ beside the checkout (developers' machines and CI alike)
# (or where $FATHOM_SEEDS_DIR points, e.g. from a git worktree)
SEEDS_DIR = Path(
    os.environ.get("FATHOM_SEEDS_DIR", Path(__file__).resolve().parents[2] / "shared" / "seeds")
)


def _numbers(text: str) -> list[float]:
    """Every number written in ``text`` (thousands commas and unicode minus understood)."""
    text = text.replace("−", "-").replace("–", " ")
    return [
        float(m.replace(",", "")) for m in re.findall(r"[-+]?\d[\d,]*\.?\d*(?:e[-+]?\d+)?", text)
    ]


def test_every_seed_value_has_source_units_and_a_quote_holding_it():
    data = load_seeds()
    assert len(data.value) >= 50
    for v in data.value:
        assert v.units and v.statistic and v.section and v.seed in data.files, v.id
        values = v.value if isinstance(v.value, tuple) else (v.value,)
        found = _numbers(v.quote)
        for x in values:
            assert any(abs(abs(x) - abs(f)) <= 1e-9 * max(1.0, abs(x)) for f in found), (
                f"{v.id}: {x} is not written in its quote {v.quote!r}"
            )
        if v.interval is not None:
            assert all(any(abs(b - f) < 1e-9 for f in found) for b in v.interval), v.id


def test_quotes_and_sections_are_verbatim_in_the_seed_files():
    if not SEEDS_DIR.exists():
        print(f"SKIPPED: the seed reports are not on this machine ({SEEDS_DIR})")
        pytest.skip(f"seed reports not at {SEEDS_DIR}")
    data = load_seeds()
    texts = {k: (SEEDS_DIR / f).read_text() for k, f in data.files.items()}
    for item in (*data.table, *data.value):
        assert item.section in texts[item.seed], f"{item.id}: section {item.section!r}"
    for v in data.value:
        assert v.quote in texts[v.seed], f"{v.id}: quote {v.quote!r} not in seed {v.seed}"
    conclusions = [t for t in data.table if t.conclusion is not None]
    assert [t.id for t in conclusions] == ["depth_scaling"]
    for t in conclusions:
        assert t.conclusion in texts[t.seed], f"{t.id}: conclusion {t.conclusion!r}"


def test_seed_000_table_is_complete():
    """Every cell of the log's results table (5 depths x 7 columns) and both observations."""
    data = load_seeds()
    values = {v.id: v for v in data.values_of("depth_scaling")}
    assert len(values) == 5 * 7 + 2
    assert values["depth.d4.vanilla.test_acc"].value == 0.614
    assert values["depth.d12.lyapunov.lambda"].value == 2.462
    assert values["depth.d8.vanilla.kappa"].value == 1.4e9
    assert values["depth.d20.delta_acc"].value == 0.0
    for v in values.values():  # each row quote is the log's row of its depth
        if v.extract.get("depth") is not None:
            assert v.quote.split()[0] == str(v.extract["depth"]), v.id


def test_bad_seed_data_is_refused_naming_the_key():
    with pytest.raises(FathomError, match="extract.kind 'nope'"):
        parse_seeds(
            'format = 1\n[files]\n"1" = "a.txt"\n[[table]]\nid="t"\nseed="1"\nsection="s"\n'
            'title="x"\ncounterpart="y"\n[[value]]\nid="v"\ntable="t"\nseed="1"\nsection="s"\n'
            'quantity="q"\nvalue=1.0\nunits="u"\nstatistic="s"\nquote="1.0"\nextract={kind="nope"}\n'
        )
    with pytest.raises(FathomError, match="table 'missing' is not a"):
        parse_seeds(
            'format = 1\n[files]\n"1" = "a.txt"\n[[table]]\nid="t"\nseed="1"\nsection="s"\n'
            'title="x"\ncounterpart="y"\n[[value]]\nid="v"\ntable="missing"\nseed="1"\nsection="s"\n'
            'quantity="q"\nvalue=1.0\nunits="u"\nstatistic="s"\nquote="1.0"\nextract={kind="none"}\n'
        )


def _seed(value: float, hardware: str | None = None) -> SeedValue:
    return SeedValue(
        id="x",
        table="t",
        seed="003",
        section="s",
        quantity="q",
        value=value,
        units="percent",
        statistic="mean",
        quote=str(value),
        hardware=hardware,
        extract={"kind": "study"},
    )


CASES = [
    # (name, seed value, per-seed Fathom values, scaled-down reason, hardware, verdict start, within)
    ("inside the range", 98.373, {101: 98.1, 102: 98.5, 103: 98.3}, None, None, "within", True),
    ("above the range", 99.0, {101: 98.1, 102: 98.5, 103: 98.3}, None, None, "outside", False),
    ("below the range", 97.0, {101: 98.1, 102: 98.5, 103: 98.3}, None, None, "outside", False),
    ("on the edge", 98.5, {101: 98.1, 102: 98.5}, None, None, "within", True),
    ("one run", 87.04, {101: 80.0}, None, None, "one run", None),
    ("scaled down", 98.373, {101: 98.1, 102: 98.5}, "scaled", None, "not comparable in mag", True),
    (
        "other hardware",
        66.22,
        {101: 30.0, 102: 31.0},
        None,
        "A100",
        "not comparable: measured",
        False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_verdicts(case):
    _, value, per_seed, scaled, hardware, start, within = case
    stats = spread(per_seed)
    sentence, got = verdict(_seed(value, hardware), Measured(per_seed), stats, scaled)
    assert sentence.startswith(start), sentence
    assert got is within
    if "outside" in sentence:
        assert ("above" in sentence) == (value > max(per_seed.values()))


def test_a_list_of_seed_values_is_reported_never_compared_as_one_number():
    """A seed value listing one number per seed (kind ``none``) has no ``number``: a
    comparison asking for one is refused naming the value, never ``float`` of a list."""
    listed = _seed(1.0).model_copy(update={"id": "per-seed", "value": (1.0, 2.0, 4.0)})
    assert _seed(98.5).number == 98.5
    with pytest.raises(FathomError, match=r"seed value 'per-seed' lists 3 values"):
        _ = listed.number


def test_spread_is_mean_sd_range_and_t_interval():
    stats = spread({101: 1.0, 102: 2.0, 103: 4.0})
    assert stats["mean"] == pytest.approx(7 / 3)
    assert stats["sd"] == pytest.approx(
        ((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) ** 0.5 / 2**0.5
    )
    half = 4.302652729911275 * stats["sd"] / 3**0.5  # t_{0.975, 2}
    assert stats["interval"] == pytest.approx([7 / 3 - half, 7 / 3 + half])
    assert (stats["min"], stats["max"], stats["n"]) == (1.0, 4.0, 3)
    assert spread({5: 3.0})["interval"] is None and spread({5: 3.0})["sd"] is None


def test_missing_counterpart_says_why():
    sentence, within = verdict(
        _seed(1.0), Measured(missing="the audit step has not run"), None, None
    )
    assert sentence == "no Fathom counterpart here: the audit step has not run" and within is None
