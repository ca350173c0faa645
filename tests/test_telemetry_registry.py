"""Registry consistency: every produced field declared exactly once; docs/metrics.md current."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fathom.telemetry import FAMILIES, FIELDS, field_for, resolve_families
from fathom.telemetry.docs import main as docs_main
from fathom.telemetry.docs import render
from fathom.telemetry.field import SCOPES
from fathom.telemetry.registry import expected_names
from test_telemetry import CASES, build, context, make_splits, recorder

torch.set_num_threads(1)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def test_every_observed_field_is_declared_exactly_once():
    model = build(CASES[3])
    splits = make_splits(n_test=6)
    rec = recorder(model, splits, probe=8)
    row = rec.observe(context(model, splits))
    assert list(row) == rec.field_names()
    used = {field_for(name).pattern for name in row}
    assert used == {f.pattern for f in FIELDS}, "every registry entry is produced by family 'all'"


def test_patterns_unique_and_entries_complete():
    patterns = [f.pattern for f in FIELDS]
    assert len(patterns) == len(set(patterns))
    for f in FIELDS:
        assert f.family in FAMILIES and f.scope in SCOPES, f.pattern
        assert f.formula and f.units, f.pattern
    layers = ["stem", "blocks.0.res.branch", "head"]
    names = expected_names(
        FAMILIES, layers, splits=("fit", "val", "test"), classes=10, inputs=layers[1:]
    )
    assert len(names) == len(set(names))
    assert "grad/pex/diversity/head" in names and "probe/act/zero_frac/head" in names
    assert "grad/pex/norm_q50/blocks.0.res.branch" in names
    assert "probe/act/zero_frac/stem" not in names, "the stem's input is the data"
    assert "split/test/class_acc/3" in names


def test_caveats_of_the_documented_traps():
    diversity = field_for("grad/pex/diversity/stem")
    assert "one example dominates" in diversity.caveats
    assert "N - 1" in field_for("grad/pex/noise_scale/blocks.1.res.branch").caveats
    assert "dead" in field_for("probe/act/zero_frac/head").caveats


def test_aliases_resolve_in_registry_order():
    assert resolve_families(["all"]) == tuple(FAMILIES)
    assert resolve_families(["params", "cheap"]) == ("probe", "activations", "params")


def test_docs_metrics_md_is_current():
    assert DOCS.exists(), "generate it with `python -m fathom.telemetry.docs`"
    assert DOCS.read_text(encoding="utf-8") == render(), (
        "stale: run `python -m fathom.telemetry.docs`"
    )


def test_docs_generator_writes_and_checks(tmp_path, capsys):
    out = tmp_path / "metrics.md"
    assert docs_main(["--out", str(out), "--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert docs_main(["--out", str(out)]) == 0
    assert docs_main(["--out", str(out), "--check"]) == 0
    for f in FIELDS:
        assert f"`{f.pattern}`" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_alone(family):
    model = build(CASES[1])
    splits = make_splits()
    row = recorder(model, splits, probe=6, families=(family,)).observe(context(model, splits))
    assert row
    assert {field_for(k).family for k in row} == {family}


def test_cli_docs_and_bad_gate(tmp_path, capsys):
    from fathom.cli import main

    out = tmp_path / "m.md"
    assert main(["telemetry", "docs", "--out", str(out)]) == 0
    assert main(["telemetry", "docs", "--out", str(out), "--check"]) == 0
    assert main(["telemetry", "qualify", "--gate", "-1"]) == 2
    assert "--gate must be a positive fraction" in capsys.readouterr().err


def test_the_word_probe_has_one_meaning():
    """A field name with "probe" is measured on the telemetry probe (first fitting
    examples); the health instrument's fields (first validation examples) never use it."""
    from fathom.telemetry.registry import FIELDS
    from fathom.telemetry.trainer_fields import TRAINER_FIELDS

    every = (*FIELDS, *TRAINER_FIELDS)
    named = [f for f in every if "probe" in f.pattern.split("/")[0]]
    assert named and all(f.scope == "probe" for f in named)
    assert not [f.pattern for f in every if f.scope == "health_probe" and "probe" in f.pattern]
    assert {f.pattern for f in TRAINER_FIELDS} >= {"lyap/maximal", "lyap/blocks", "jac/examples"}


def test_the_trainer_fields_are_declared_once():
    from fathom.telemetry.registry import field_for

    for name in ("epoch", "step", "train/loss_running", "val/acc", "test/ce", "fit/ce"):
        assert field_for(name).family == "trainer"
    for name in ("clock/training_s", "clock/elapsed_s", "diverged", "optim/lr"):
        assert field_for(name).pattern == name


def test_config_family_names_are_the_registry_families_then_aliases() -> None:
    """``telemetry.families`` is checked when a config is validated (no torch there), against
    the names the registry resolves: a family added to one list and not the other fails here."""
    from typing import get_args

    from fathom.config.run import TelemetryFamily
    from fathom.telemetry.registry import ALIASES, FAMILIES

    assert get_args(TelemetryFamily) == (*FAMILIES, *ALIASES)


def test_a_misspelt_family_in_a_config_is_refused_at_validation_with_a_suggestion() -> None:
    import pytest

    from fathom.config import validate_run_config
    from fathom.errors import FathomError

    with pytest.raises(FathomError, match=r"telemetry\.families.*did you mean 'gradients'"):
        validate_run_config({"model": {"width_mult": 0.1}, "telemetry": {"families": ["grad"]}})
