"""A nested state as tensors plus JSON: what a resume state is on disk, without pickle.

:func:`encode_state` splits a state (dicts, lists, tuples, ``None``, bools, ints, floats,
strings and tensors, nested in any way: a model's and an optimizer's ``state_dict``, RNG
states, clocks, counters) into

* the tensors, named ``t0``, ``t1``, ... in the order a depth-first walk meets them, each
  detached, on the host and contiguous (a copy, so no two share storage);
* a JSON text of everything else, compact, keys in their insertion order (the order is part
  of the state: a dict written back to a history row keeps its key order), where a tensor
  is ``{"$tensor": i}``. Values JSON has no form for are tagged by one key starting with
  ``$``: ``{"$tuple": [...]}``, ``{"$float": "nan" | "inf" | "-inf"}``, and
  ``{"$dict": [[key, value], ...]}`` for a dict with a non-string key (an optimizer's
  parameter indices) or a key starting with ``$``.

:func:`decode_state` inverts it exactly: ``decode_state(*encode_state(s))`` equals ``s``
value for value and type for type (a mapping comes back as a ``dict``, a tuple subclass
such as ``torch.Size`` as a ``tuple``). Nothing is imported or called by name while
decoding: the JSON can only describe the types above. A value of any other type is refused
when encoding, naming where it is in the state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import torch

from fathom.errors import FathomError

TAGS = ("$tensor", "$tuple", "$float", "$dict")


def encode_state(state: Any) -> tuple[dict[str, torch.Tensor], str]:
    """``(tensors, json_text)`` of ``state``; a value of an unsupported type is refused."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors, "state")
    return tensors, json.dumps(tree, separators=(",", ":"), allow_nan=False)


def decode_state(tensors: Mapping[str, torch.Tensor], text: str) -> Any:
    """Inverse of :func:`encode_state`; a malformed text or a missing tensor is a
    ``ValueError`` (the caller names the file)."""
    tree = json.loads(text, parse_constant=_no_constant)
    used: set[str] = set()
    out = _decode(tree, tensors, used)
    if used != set(tensors):
        raise ValueError(f"tensors {sorted(set(tensors) - used)[:5]} are not part of the state")
    return out


def _encode(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {"$float": repr(float(value))}
    if isinstance(value, torch.Tensor):
        return {"$tensor": _add_tensor(value, tensors, where)}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else {"$tuple": items}
    if isinstance(value, Mapping):
        plain = all(isinstance(k, str) and not k.startswith("$") for k in value)
        if plain:
            return {k: _encode(v, tensors, f"{where}[{k!r}]") for k, v in value.items()}
        return {
            "$dict": [
                [_encode(k, tensors, f"{where} key {k!r}"), _encode(v, tensors, f"{where}[{k!r}]")]
                for k, v in value.items()
            ]
        }
    raise FathomError(
        f"the resume state holds a {type(value).__module__}.{type(value).__qualname__} at "
        f"{where}; a resume state holds only tensors, numbers, strings, None, lists, tuples "
        "and dicts (it is stored as safetensors + JSON, never pickled). Make that "
        "state_dict() return one of these (e.g. a tensor or a list of numbers)"
    )


def _add_tensor(value: torch.Tensor, tensors: dict[str, torch.Tensor], where: str) -> int:
    if value.is_complex() or value.is_quantized or value.is_sparse:
        raise FathomError(
            f"the resume state holds a {value.dtype} {value.layout} tensor at {where}, which "
            "safetensors cannot store; keep it as a dense real tensor (e.g. torch.view_as_real)"
        )
    i = len(tensors)
    tensors[f"t{i}"] = value.detach().to("cpu", copy=True).contiguous()
    return i


def _decode(node: Any, tensors: Mapping[str, torch.Tensor], used: set[str]) -> Any:
    if isinstance(node, list):
        return [_decode(v, tensors, used) for v in node]
    if not isinstance(node, dict):
        return node  # None, bool, int, float, str: JSON's own
    tag = [k for k in node if k.startswith("$")]
    if not tag:
        return {k: _decode(v, tensors, used) for k, v in node.items()}
    if len(node) != 1 or tag[0] not in TAGS:
        raise ValueError(f"unknown or mixed tag {sorted(node)[:3]}")
    key, body = tag[0], node[tag[0]]
    if key == "$tensor":
        name = f"t{body}"
        if type(body) is not int or name not in tensors or name in used:
            raise ValueError(f"tensor reference {body!r} is missing or repeated")
        used.add(name)
        return tensors[name]
    if key == "$tuple":
        return tuple(_decode(v, tensors, used) for v in _list(body))
    if key == "$float":
        if body not in ("nan", "inf", "-inf"):
            raise ValueError(f"non-finite float {body!r} is not nan, inf or -inf")
        return float(body)
    pairs = [_decode(p, tensors, used) for p in _list(body)]
    if any(not isinstance(p, list) or len(p) != 2 for p in pairs):
        raise ValueError("a tagged dict is not a list of [key, value] pairs")
    return {k: v for k, v in pairs}


def _list(body: Any) -> list[Any]:
    if not isinstance(body, list):
        raise ValueError(f"a tagged value holds {type(body).__name__}, not a list")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"JSON constant {name} (non-finite floats are tagged)")
