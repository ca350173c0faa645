"""The model kinds: one row per ``model.kind``, every question a kind answers in one place.

A row names the kind's config class (a member of :data:`ModelSpec`, the discriminated union
``RunConfig.model`` is validated with, built from this table), its builder and its drop
schedule and its hidden widths (``"module:function"`` paths into :mod:`fathom.models`,
resolved there on first use so that this layer imports no torch), what it takes from the data
(``shape``), its label in the audit, its size as the report states it, the config field naming a user's factory (imported by ``fathom validate``, its
logits checked before training), and whether a study's recipes or the Lyapunov instruments
apply to it. A new model kind is its config class, its model module and one row here.

:func:`model_kind` is the one lookup: an unknown kind is a :class:`FathomError` naming it and
the known kinds, at every place that asks — never a fall-through to another kind. A reader of
a recorded ``[model]`` table (a run directory) asks :func:`recorded_model`, which says
explicitly when this version cannot read the table, rather than guess a kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field

from fathom.config.models import GPTConfig, ModelConfig, PythonModelConfig, StagedConvConfig
from fathom.errors import FathomError, with_suggestion

Shape = Literal["none", "in_features", "input_shape"]
"""What a builder takes from the data: nothing (a user's factory shapes itself), the
flattened input size (an MLP), or one example's shape (a conv net)."""


def _no_reason(model: Any) -> str | None:
    return None


@dataclass(frozen=True)
class ModelKind:
    """One model kind (module docstring): every column filled, none inferred from the name."""

    name: str
    config: type[BaseModel]  # its ``kind`` field is ``Literal[name]``
    builder: str  # "fathom.models.X:function"(cfg, DataShape) -> nn.Module
    shape: Shape
    drop_schedule: str | None  # "fathom.models.X:function"(cfg, epochs) -> DropSchedule | None
    label: Callable[[Any, Mapping[str, Any]], str]  # (model config, run tags) -> audit family
    widths: str | None
    """``"fathom.models.specs:function"``(cfg) -> ``tuple[int, ...]``: the hidden widths its
    builder makes from the config (after ``width_mult``), as the exports' "as trained" and a
    study's scale-down sentence state them; a function of a module without torch
    (:mod:`fathom.models.specs`), so that stating them costs none; ``None``: the model shapes
    itself (a user's factory) and the kind states no widths."""
    size: Callable[[Any], str]
    """(model config) -> the model's size in its own config's terms, as the report's "what
    was run" states it (``width × 0.1``, ``4 blocks of width 128``)."""
    factory: str | None = None  # the config field holding a user's "package.module:function"
    recipes: bool = False  # a study's recipes (Ciresan recipes) are this kind's
    lyapunov: bool = False  # may provide lyapunov_blocks() (regularizer, health instrument)
    tokens: bool = False
    """Its output is next-token logits ``[N, T, V]`` on text windows, trained and scored by
    token-level cross-entropy (:func:`fathom.models.gpt.token_cross_entropy`), not ``[N, C]``."""
    no_branches: Callable[[Any], str | None] = field(default=_no_reason)
    """Why a model of this config has no removable branch, when the kind knows better than
    the audit's general sentence (``None``: the general sentence)."""
    nonlinearity: Callable[[Any], str] = field(default=lambda model: "ReLU")
    """The hidden units' nonlinearity of a model of this config, as the report names it
    (the activation-telemetry tables say whose zeros they count)."""


def _staged_label(model: StagedConvConfig, tags: Mapping[str, Any]) -> str:
    return f"staged_conv-{str(tags.get('arm', 'run')).lower()}-d{model.depth}"


def _staged_no_branches(model: StagedConvConfig) -> str | None:
    if not model.residual:
        return None
    return (
        "a residual staged conv net has a skippable branch from the second block of each of "
        f"its 4 stages on, and depth {model.depth} is one block per stage; audit a "
        "depth-scaling run of depth 8 or more with --residual"
    )


def _staged_nonlinearity(model: StagedConvConfig) -> str:
    spiking = model.neuron == "lif" and model.timesteps > 0  # as fathom.models.convnet
    return f"spiking LIF (T={model.timesteps})" if spiking else "ReLU"


def _width_mult(model: ModelConfig | StagedConvConfig) -> str:
    return f"width × {model.width_mult:g}"


MODEL_KINDS: dict[str, ModelKind] = {
    row.name: row
    for row in (
        ModelKind(
            name="ciresan",
            config=ModelConfig,
            builder="fathom.models.ciresan:build",
            shape="in_features",
            drop_schedule="fathom.models.ciresan:drop_schedule",
            label=lambda model, tags: model.recipe,
            widths="fathom.models.specs:ciresan_widths",
            size=_width_mult,
            recipes=True,
        ),
        ModelKind(
            name="staged_conv",
            config=StagedConvConfig,
            builder="fathom.models.convnet:build",
            shape="input_shape",
            drop_schedule=None,
            label=_staged_label,
            widths="fathom.models.specs:staged_conv_widths",
            size=_width_mult,
            lyapunov=True,
            no_branches=_staged_no_branches,
            nonlinearity=_staged_nonlinearity,
        ),
        ModelKind(
            name="python",
            config=PythonModelConfig,
            builder="fathom.models.factory:build",
            shape="none",
            drop_schedule="fathom.models.factory:drop_schedule",
            label=lambda model, tags: f"python-{model.factory}",
            widths=None,  # the factory's model shapes itself
            size=lambda model: f"as {model.factory} builds it",
            factory="factory",
            lyapunov=True,
            nonlinearity=lambda model: "nonlinearity",  # the factory's own, unnamed
        ),
        ModelKind(
            name="gpt",
            config=GPTConfig,
            builder="fathom.models.gpt:build",
            shape="input_shape",
            drop_schedule="fathom.models.gpt:drop_schedule",
            label=lambda model, tags: f"gpt-l{model.layers}-w{model.width}",
            widths="fathom.models.specs:gpt_widths",
            size=lambda model: f"{model.layers} blocks of width {model.width}",
            tokens=True,
            nonlinearity=lambda model: "GELU",
        ),
    )
}
"""The table (module docstring), in the order errors list the kinds."""

DEFAULT_KIND = "ciresan"
"""The kind of a ``[model]`` table without ``kind``: the Ciresan MLP (the historical default)."""


def model_kind(name: str) -> ModelKind:
    """The row of ``name``; an unknown kind is refused naming the known ones."""
    row = MODEL_KINDS.get(name)
    if row is None:
        known = list(MODEL_KINDS)
        head = with_suggestion(f"model.kind: unknown kind {name!r}", str(name), known)
        raise FathomError(f"{head}; choose one of {', '.join(known)}")
    return row


def recorded_model(model: Mapping[str, Any]) -> tuple[ModelKind, BaseModel] | None:
    """The row and the typed config of a ``[model]`` table read back from a run directory
    (no ``kind``: ``ciresan``, as :class:`~fathom.config.RunConfig` reads it); ``None``, said
    explicitly, for a kind this version has no row for or a table it no longer validates (a
    run recorded by another version): its reader then states nothing of the model, never
    another kind's answer."""
    row = MODEL_KINDS.get(str(model.get("kind", DEFAULT_KIND)))
    if row is None:
        return None
    try:
        return row, row.config.model_validate(dict(model))
    except ValueError:  # pydantic's ValidationError is one
        return None


ModelSpec = Annotated[
    Union[tuple(row.config for row in MODEL_KINDS.values())],  # noqa: UP007
    Field(discriminator="kind"),
]
"""A ``[model]`` table, validated as the member its ``kind`` names."""
