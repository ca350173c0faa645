"""``hypothesis`` strategies that generate config data from the pydantic models' own fields.

:func:`model_data` walks a model's fields (type, bounds from ``Field(gt=..., le=...)``,
``Literal`` choices, nested models, discriminated unions) and draws a dict that sets a
random subset of them; what the model's cross-field validators refuse is filtered out by
the tests (``assume``). A field added to a config is generated without touching this file.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

import annotated_types as at
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from fathom.config.models import NAME_MAX_BYTES

JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-100, 100),
    st.floats(-10, 10, allow_nan=False),
    st.text(max_size=4),
)
NAMES = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,11}\Z")
"""Names the name rule accepts (its refusals are tested in tests/test_config_names.py)."""


def _bounds(metadata: list[Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in metadata:
        for key in ("gt", "ge", "lt", "le"):
            if isinstance(m, getattr(at, key.capitalize())):
                out[key] = getattr(m, key)
    return out


def _number(kind: type, bounds: dict[str, float]) -> st.SearchStrategy:
    lo = bounds.get("ge", bounds.get("gt", -5 if kind is int else -10.0))
    hi = bounds.get("le", bounds.get("lt", 300 if kind is int else 10.0))
    if kind is int:
        lo = int(lo) + (1 if "gt" in bounds else 0)
        hi = int(hi) - (1 if "lt" in bounds else 0)
        return st.integers(lo, max(lo, hi))
    return st.floats(
        lo,
        hi,
        allow_nan=False,
        allow_infinity=False,
        exclude_min="gt" in bounds,
        exclude_max="lt" in bounds,
    )


def for_annotation(tp: Any, metadata: list[Any] = (), field: str = "") -> st.SearchStrategy:
    """A strategy of JSON-like values for the annotation ``tp`` (with field ``metadata``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return for_annotation(args[0], [*metadata, *tp.__metadata__], field)
    if any(getattr(getattr(m, "func", None), "__name__", "") == "check_name" for m in metadata):
        return NAMES
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, types.UnionType):
        return st.one_of(*(for_annotation(a, metadata, field) for a in args))
    if tp is type(None):
        return st.none()
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return model_data(tp)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(for_annotation(args[0], (), field), max_size=4)
        return st.tuples(*(for_annotation(a, (), field) for a in args)).map(list)
    if origin is list:
        return st.lists(for_annotation(args[0], (), field), max_size=4)
    if origin is dict:
        return st.dictionaries(NAMES, for_annotation(args[1], (), field), max_size=3)
    if tp is bool:
        return st.booleans()
    if tp in (int, float):
        return _number(tp, _bounds(list(metadata)))
    if tp is str:
        return st.text(max_size=NAME_MAX_BYTES // 16)
    if tp is Any:
        return JSON_LEAF
    raise TypeError(f"no strategy for {tp!r} ({field}): extend tests/config_strategies.py")


HINTS: dict[str, st.SearchStrategy] = {}
"""Per ``"Model.field"``, a strategy for a field whose valid values a type cannot say (a
plain ``str`` naming a dataset, a depth that must be a multiple of 4); set by the tests."""


def _field(model: type[BaseModel], name: str, info: FieldInfo) -> st.SearchStrategy:
    hint = HINTS.get(f"{model.__name__}.{name}")
    if hint is not None:
        return hint
    return for_annotation(info.annotation, list(info.metadata), name)


def _tag(info: FieldInfo) -> Any:
    """The one value of a ``kind: Literal["x"]`` discriminator field, else ``None``."""
    args = typing.get_args(info.annotation)
    if typing.get_origin(info.annotation) is Literal and len(args) == 1:
        return args[0]
    return None


def model_data(
    model: type[BaseModel], fixed: dict[str, Any] | None = None, skip: tuple[str, ...] = ()
) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts that set a random subset of ``model``'s fields (``fixed`` ones, required ones and
    a single-valued ``kind`` always; ``skip`` never; excluded fields never)."""
    fixed = dict(fixed or {})
    if "kind" in model.model_fields and _tag(model.model_fields["kind"]) is not None:
        fixed.setdefault("kind", _tag(model.model_fields["kind"]))
    optional = {
        name: _field(model, name, info)
        for name, info in model.model_fields.items()
        if name not in fixed and name not in skip and not info.exclude
    }
    required = {
        n: optional.pop(n)
        for n, i in model.model_fields.items()
        if i.is_required() and n in optional
    }
    return st.fixed_dictionaries(
        {**{k: st.just(v) for k, v in fixed.items()}, **required}, optional=optional
    )
