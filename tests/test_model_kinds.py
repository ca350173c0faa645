"""The model-kind table (``fathom.config.model_kinds``): complete, the one dispatch, loud.

Every place that once chose by ``if model.kind == ...`` now asks the kind's row; an unknown
kind is refused at each of them naming itself and the known kinds; a new kind is one row
(shown with a toy kind registered here, built, scheduled and labelled without touching
any other module).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any, Literal, get_args

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict
from torch import nn

from fathom.audit import run as audit_run
from fathom.config import DataConfig, RunConfig, validate_run_config
from fathom.config.inputs import check_inputs
from fathom.config.model_kinds import MODEL_KINDS, ModelKind, ModelSpec, Shape, model_kind
from fathom.config.models import ModelConfig
from fathom.depth import DropSchedule, SkippableResidual, find_branches
from fathom.errors import FathomError
from fathom.models import build_model, kind_function
from fathom.models.specs import DataShape
from fathom.study.config import StudyConfig
from fathom.train.build import build_controller, build_schedule, init_model

SRC = Path(__file__).resolve().parents[1] / "src" / "fathom"
KNOWN = ", ".join(MODEL_KINDS)


def _with_model(model: Any) -> RunConfig:
    """A run config holding ``model`` as given (not re-validated: how an unknown kind or a
    kind registered after import reaches the code that dispatches on it)."""
    return RunConfig().model_copy(update={"model": model})


# ---- the table is complete -------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODEL_KINDS))
def test_every_row_fills_every_column(name: str) -> None:
    row = MODEL_KINDS[name]
    assert row.name == name
    assert row.config.model_fields["kind"].default == name
    assert row.shape in get_args(Shape)
    assert callable(kind_function(row.builder))
    if row.drop_schedule is not None:
        assert callable(kind_function(row.drop_schedule))
    # the table's own builders and schedules live in the model layer (the trainer imports it)
    for path in (row.builder, row.drop_schedule):
        assert path is None or path.startswith("fathom.models."), path
    assert row.factory is None or row.factory in row.config.model_fields
    assert callable(row.label) and callable(row.no_branches)


def test_the_config_union_is_the_tables_classes_in_its_order() -> None:
    members = get_args(get_args(ModelSpec)[0])
    assert members == tuple(row.config for row in MODEL_KINDS.values())


def test_no_module_compares_a_model_kind_by_name() -> None:
    """No ``x.kind == "ciresan"`` (or ``!=``, ``in``) outside the table: kinds are rows."""
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "model_kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = {
                e.value
                for s in sides
                for e in ([s] if not isinstance(s, ast.Tuple | ast.List | ast.Set) else s.elts)
                if isinstance(e, ast.Constant)
            }
            kind = any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides)
            if kind and names & set(MODEL_KINDS):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found


# ---- an unknown kind is refused at every place that dispatches on a kind ----------------


def _study_with(model: Any) -> StudyConfig:
    return StudyConfig.model_construct(base=_with_model(model))


SITES: dict[str, Any] = {
    "model_kind": lambda m: model_kind(m.kind),
    "build_model": lambda m: build_model(m, 10, 784),
    "init_model": lambda m: init_model(_with_model(m), 10, 784),
    "build_schedule": lambda m: build_schedule(_with_model(m)),
    "check_inputs": lambda m: check_inputs(DataConfig(), m),
    "RunConfig validator": lambda m: _with_model(m)._epochs_in_range(),
    "StudyConfig validator": lambda m: _study_with(m)._ciresan_base(),
    "audit family": lambda m: audit_run._family(_with_model(m)),
}


def _refused_everywhere(kind: str) -> None:
    model = ModelConfig().model_copy(update={"kind": kind})
    for site, call in SITES.items():
        with pytest.raises(FathomError) as e:
            call(model)
        assert f"unknown kind {kind!r}" in str(e.value), site
        assert f"choose one of {KNOWN}" in str(e.value), site


@settings(max_examples=15, deadline=None)
@given(st.text(min_size=0, max_size=12).filter(lambda k: k not in MODEL_KINDS))
@example("resnet")
@example("")
@example("Ciresan")
def test_an_unknown_kind_is_refused_at_every_site(kind: str) -> None:
    _refused_everywhere(kind)


def test_a_near_miss_is_answered_with_a_suggestion() -> None:
    with pytest.raises(FathomError, match="did you mean 'staged_conv'"):
        model_kind("staged_cov")


def test_the_refusal_at_validation_names_the_kinds_of_the_table() -> None:
    with pytest.raises(FathomError, match=f"unknown kind 'resnet'.*; choose one of {KNOWN}"):
        validate_run_config({"model": {"kind": "resnet"}})


# ---- a new kind is one row ---------------------------------------------------------------


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["toy"] = "toy"
    width: int = 5
    drop: float = 0.25


class ToyNet(nn.Module):
    def __init__(self, d_in: int, width: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.res = SkippableResidual(nn.Linear(width, width), nn.Identity())
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.res(torch.relu(self.inp(x.flatten(1))))))


def build_toy(cfg: ToyConfig, shape: DataShape) -> nn.Module:
    assert shape.classes is not None and shape.in_features is not None
    return ToyNet(shape.in_features, cfg.width, shape.classes)


def toy_schedule(cfg: ToyConfig, epochs: int) -> DropSchedule:
    return DropSchedule("constant", (cfg.drop,), None)


TOY = ModelKind(
    name="toy",
    config=ToyConfig,
    builder=f"{__name__}:build_toy",
    shape="in_features",
    drop_schedule=f"{__name__}:toy_schedule",
    label=lambda model, tags: f"toy-w{model.width}",
)


def test_a_kind_registered_as_one_row_is_built_scheduled_and_labelled(monkeypatch) -> None:
    monkeypatch.setitem(MODEL_KINDS, "toy", TOY)
    cfg = _with_model(ToyConfig())
    model = init_model(cfg, classes=3, input_shape=(2, 2))
    assert isinstance(model, ToyNet)
    assert model.inp.in_features == 4 and model.out.out_features == 3  # shape from the data
    assert build_schedule(cfg) == DropSchedule("constant", (0.25,), None)
    controller = build_controller(model, cfg)
    assert controller is not None and len(find_branches(model)) == 1
    assert audit_run._family(cfg) == "toy-w5"
    assert check_inputs(DataConfig(), cfg.model) == []  # no user factory to import
    with pytest.raises(ValueError, match="lyapunov_blocks"):  # the row says it has none
        health = cfg.health.model_copy(update={"enabled": True})
        cfg.model_copy(update={"health": health})._epochs_in_range()
    with pytest.raises(ValueError, match="Ciresan MLP recipes"):
        _study_with(cfg.model)._ciresan_base()


def test_the_dispatching_functions_name_no_kind() -> None:
    """Their code (docstrings aside) holds no model-kind name: a new row reaches them all."""
    for fn in (build_model, build_schedule, init_model, check_inputs, audit_run._family):
        tree = ast.parse(inspect.getsource(fn).strip())
        body = tree.body[0].body[1:]  # without the docstring
        names = {n.value for b in body for n in ast.walk(b) if isinstance(n, ast.Constant)}
        assert not names & set(MODEL_KINDS), fn.__name__
