"""The model-kind table (``fathom.config.model_kinds``): complete, the one dispatch, loud.

Every place that once chose by ``if model.kind == ...`` now asks the kind's row; an unknown
kind is refused at each of them naming itself and the known kinds; a new kind is one row
(shown with a toy kind registered here, built, scheduled and labelled without touching
any other module).
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from dataclasses import replace
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
from fathom.config.model_kinds import (
    DEFAULT_KIND,
    MODEL_KINDS,
    ModelKind,
    ModelSpec,
    Shape,
    model_kind,
    recorded_model,
)
from fathom.config.models import ModelConfig
from fathom.depth import DropSchedule, SkippableResidual, find_branches
from fathom.errors import FathomError
from fathom.export.describe import as_trained
from fathom.models import build_model, kind_function
from fathom.models.specs import DataShape
from fathom.report.runs import RunData
from fathom.report.sections import what_was_run
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
    if row.widths is not None:
        assert callable(kind_function(row.widths))
    # the table's own builders, schedules and widths live in the model layer (the trainer
    # imports it)
    for path in (row.builder, row.drop_schedule, row.widths):
        assert path is None or path.startswith("fathom.models."), path
    assert row.factory is None or row.factory in row.config.model_fields
    assert callable(row.label) and callable(row.no_branches) and callable(row.size)
    default = row.config.model_validate({"factory": "m:f"} if row.factory else {})
    assert isinstance(row.size(default), str) and row.size(default)


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


def test_no_module_keeps_a_table_keyed_by_model_kind() -> None:
    """No ``{"ciresan": ..., "staged_conv": ...}`` outside the table: what a kind knows is a
    column of its row (a dict keyed by kind names misses every kind added later)."""
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "model_kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                kinds = {k.value for k in node.keys if isinstance(k, ast.Constant)} & set(
                    MODEL_KINDS
                )
                # "python" alone also names a dataset and the interpreter's version
                if kinds - {"python"} or len(kinds) > 1:
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
    widths=f"{__name__}:toy_widths",
    size=lambda model: f"width {model.width}",
)


def toy_widths(cfg: ToyConfig) -> tuple[int, ...]:
    return (cfg.width,)


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
    run = RunData(Path("r"), "r", {"config": {"model": ToyConfig().model_dump()}}, [])
    assert as_trained(run)["model.widths"] == [5]  # the exports' "as trained" reads the row
    assert "width 5" in what_was_run(None, [run])  # so does the report's "what was run"
    assert check_inputs(DataConfig(), cfg.model) == []  # no user factory to import
    with pytest.raises(ValueError, match="lyapunov_blocks"):  # the row says it has none
        health = cfg.health.model_copy(update={"enabled": True})
        cfg.model_copy(update={"health": health})._epochs_in_range()
    with pytest.raises(ValueError, match="Ciresan MLP recipes"):
        _study_with(cfg.model)._ciresan_base()


# Each kind's hidden widths read off a built model's parameters (not its config or its own
# attributes): the widths its row states must be these. A kind with widths and no reader
# here fails the test below, loudly.
_BUILT_WIDTHS: dict[str, Any] = {
    "ciresan": lambda m: [x.out_features for x in m.modules() if isinstance(x, nn.Linear)][:-1],
    "staged_conv": lambda m: list(
        dict.fromkeys(c.out_channels for c in m.modules() if isinstance(c, nn.Conv2d))
    ),
    "gpt": lambda m: [b.branch.ln_1.normalized_shape[0] for b in m.blocks],
}
_SMALL: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # (config, data shape)
    "ciresan": ({"width_mult": 0.01}, {"in_features": 784}),
    "staged_conv": ({"width_mult": 0.25}, {"input_shape": (3, 32, 32), "dataset": "cifar10"}),
    "gpt": ({"layers": 3, "width": 8, "heads": 2}, {"input_shape": (16,)}),
}


@pytest.mark.parametrize("name", [n for n, row in MODEL_KINDS.items() if row.widths is not None])
def test_a_kinds_widths_are_those_its_builder_makes(name: str) -> None:
    row = MODEL_KINDS[name]
    assert name in _BUILT_WIDTHS, f"kind {name!r} states widths: add its reader above"
    config, shape = _SMALL[name]
    cfg = row.config.model_validate(config)
    built = build_model(cfg, 10, **shape)
    stated = list(kind_function(row.widths)(cfg))
    assert stated == _BUILT_WIDTHS[name](built)
    run = RunData(Path("r"), "r", {"config": {"model": cfg.model_dump()}}, [])
    assert as_trained(run)["model.widths"] == stated


def test_a_kinds_widths_are_stated_without_torch() -> None:
    """Every row's widths function lives in a module without torch, so that a study's
    scale-down sentence (before any run) and an export state the widths importing none."""
    code = (
        "import importlib, sys\n"
        "from fathom.config.model_kinds import MODEL_KINDS\n"
        "for row in MODEL_KINDS.values():\n"
        "    if row.widths:\n"
        "        module, _, name = row.widths.partition(':')\n"
        "        cfg = row.config.model_validate({})\n"
        "        assert getattr(importlib.import_module(module), name)(cfg)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_lyapunov_refusal_names_the_kinds_of_the_table(monkeypatch) -> None:
    """Which models the Lyapunov instruments need is the rows' ``lyapunov`` column: a kind
    registered with it is named in the refusal, one with a user's factory as "providing it"."""
    health = RunConfig().health.model_copy(update={"enabled": True})
    cfg = RunConfig().model_copy(update={"health": health})
    with pytest.raises(ValueError, match=r"\(model.kind 'staged_conv', or a 'python' model "):
        cfg._epochs_in_range()
    monkeypatch.setitem(MODEL_KINDS, "toy", replace(TOY, lyapunov=True))
    with pytest.raises(ValueError, match=r"model.kind 'staged_conv', 'toy', or a 'python'"):
        cfg._epochs_in_range()


def test_a_model_table_without_kind_is_the_default_kind() -> None:
    assert RunConfig.model_validate({"model": {"width_mult": 0.5}}).model.kind == DEFAULT_KIND
    assert MODEL_KINDS[DEFAULT_KIND].recipes  # the historical Ciresan default


def test_a_model_table_this_version_cannot_read_is_said_so() -> None:
    """A recorded ``[model]`` of an unknown kind, or one that no longer validates, is read as
    nothing (``None``), never as another kind; a table without ``kind`` is the Ciresan MLP."""
    assert recorded_model({"kind": "resnet"}) is None
    assert recorded_model({"kind": "gpt", "width": 10, "heads": 3}) is None  # 10 % 3 != 0
    row, cfg = recorded_model({"width_mult": 0.5})
    assert row is MODEL_KINDS["ciresan"] and cfg == ModelConfig(width_mult=0.5)
    run = RunData(Path("r"), "r", {"config": {"model": {"kind": "resnet"}}}, [])
    assert "model.widths" not in as_trained(run)
    assert "size not readable" in what_was_run(None, [run])


def test_the_dispatching_functions_name_no_kind() -> None:
    """Their code (docstrings aside) holds no model-kind name: a new row reaches them all."""
    for fn in (
        build_model,
        build_schedule,
        init_model,
        check_inputs,
        audit_run._family,
        as_trained,
        recorded_model,
    ):
        tree = ast.parse(inspect.getsource(fn).strip())
        body = tree.body[0].body[1:]  # without the docstring
        names = {n.value for b in body for n in ast.walk(b) if isinstance(n, ast.Constant)}
        assert not names & set(MODEL_KINDS), fn.__name__
