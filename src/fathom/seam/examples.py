"""The example dimension of every captured tensor, and whether examples are independent.

:func:`fathom.seam.discover` runs the model's forward on 2 and 3 examples (the discovery
batch ``x_b``) under hooks on every module. :func:`call_dims` finds, for every input and
output leaf of every module call, the dimension that grows by ``k`` entries per example
(:func:`_example_dim`, ``k > 1`` for time-folded tensors), and checks that the 3-example
tensor's first rows reproduce the 2-example ones: a batch statistic or randomness changes
them. That check cannot see examples that mix *causally* (example ``i``'s output depends on
examples ``j < i`` only: a ``cumsum`` over the examples), since appending an example changes
nothing before it; so the forward also runs on the discovery batch with its examples
shifted by one (:data:`SHIFT`), and :func:`check_mixing` requires every module's
per-example outputs to follow their inputs. It refuses, naming the first module (in
completion order) whose inputs are independent and follow the shift while its outputs do not
(on 3 examples against 2, or shifted): where the mixing starts, not a consumer downstream.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from fathom.errors import FathomError
from fathom.seam.types import ROOT

SHIFT = (1, 2, 0)  # the discovery batch's examples, shifted by one


def close(a: torch.Tensor, b: torch.Tensor, *, rtol: float, atol: float) -> bool:
    """``torch.allclose(a, b, rtol, atol)``: ``|a - b| <= atol + rtol |b|`` entrywise.

    Answered first by ``max |a - b| <= atol``, which implies it (one subtraction and one
    reduction where ``allclose`` makes several passes); a NaN, or a difference above
    ``atol``, falls through to ``allclose`` itself."""
    fast = a.shape == b.shape and a.dtype == b.dtype and a.numel() > 0
    if fast and float(torch.sub(a, b).abs_().max()) <= atol:
        return True
    return torch.allclose(a, b, rtol=rtol, atol=atol)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal within ``1e-4`` relative and ``1e-5 max(|b|, 1)`` (integer tensors exactly)."""
    if not a.is_floating_point():
        return torch.equal(a, b)
    return close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max().clamp_min(1.0)))


def _example_dim(
    a: Any, b: Any, na: int, nb: int, where: str, check: bool = True
) -> tuple[int, int] | None:
    """``(dim, k)`` of a leaf seen with ``na`` and ``nb`` examples, ``None`` if not per-example;
    with ``check``, ``b``'s first ``na`` examples must be ``a`` (independence)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return None
    if a.shape == b.shape:
        return None
    diff = [d for d in range(a.dim()) if a.dim() == b.dim() and a.shape[d] != b.shape[d]]
    k = (b.shape[diff[0]] - a.shape[diff[0]]) // (nb - na) if len(diff) == 1 else 0
    if len(diff) != 1 or k < 1 or a.shape[diff[0]] != k * na or b.shape[diff[0]] != k * nb:
        raise FathomError(
            f"cannot find the example dimension of {where}: shapes {list(a.shape)} with {na} "
            f"examples and {list(b.shape)} with {nb}; instruments need one dimension that grows "
            "by a fixed number of entries per example"
        )
    d = diff[0]
    if check and not _head_same(a, b, (d, k)):
        raise FathomError(
            f"examples are not independent at {where}: its first {na} examples change when a "
            "further example joins the batch (batch statistics, randomness in train mode, or a "
            "time-major fold); per-example quantities are undefined there — run in eval mode"
        )
    return (d, k)


def _head_same(a: Any, b: Any, dim: tuple[int, int] | None) -> bool:
    """``b``'s first examples are ``a`` (leaves seen with 2 and 3 examples)."""
    if dim is None or not isinstance(a, torch.Tensor):
        return True
    return same(b.detach().narrow(dim[0], 0, a.shape[dim[0]]), a.detach())


def call_dims(label: str, calls_a: list, calls_b: list) -> list[tuple[list, list]]:
    """Per call of a module: the example dims of its input leaves and output leaves."""
    if len(calls_a) != len(calls_b):
        raise FathomError(
            f"module {label!r} is called {len(calls_a)} times on 2 examples and {len(calls_b)} "
            "times on 3: its calls depend on the batch size, so they cannot be split per example"
        )
    out = []
    for c, ((aa, ka, oa), (ab, kb, ob)) in enumerate(zip(calls_a, calls_b, strict=True)):
        where_in = f"an input of module {label!r} (call {c})"
        where_out = f"the output of module {label!r} (call {c})"
        la, lb = pytree.tree_leaves((aa, ka)), pytree.tree_leaves((ab, kb))
        oa_l, ob_l = pytree.tree_leaves(oa), pytree.tree_leaves(ob)
        if len(la) != len(lb) or len(oa_l) != len(ob_l):
            raise FathomError(f"module {label!r} changes its call structure with the batch size")
        ins = [_example_dim(a, b, 2, 3, where_in) for a, b in zip(la, lb, strict=True)]
        outs = [_example_dim(a, b, 2, 3, where_out) for a, b in zip(oa_l, ob_l, strict=True)]
        out.append((ins, outs))
    return out


def _follows(b: Any, r: Any, dim: tuple[int, int] | None) -> bool:
    """Leaf ``r`` (shifted batch) is leaf ``b`` with its examples shifted by :data:`SHIFT`."""
    if dim is None or not isinstance(b, torch.Tensor) or not isinstance(r, torch.Tensor):
        return True
    d, k = dim
    index = torch.tensor(SHIFT, device=b.device)
    want = b.detach().unflatten(d, (len(SHIFT), k)).index_select(d, index).flatten(d, d + 1)
    return want.shape == r.shape and same(r.detach(), want)


def _leaves(call: tuple) -> tuple[list, list]:
    args, kwargs, out = call
    return pytree.tree_leaves((args, kwargs)), pytree.tree_leaves(out)


def _culprit(a: tuple, b: tuple, r: tuple) -> str | None:
    """How one module call mixes examples (``a``, ``b``, ``r``: the call on 2, 3 and the 3
    shifted examples): ``"joins"``, ``"shift"``, or ``None`` where it does not, or where its
    inputs already do (the culprit is upstream) or have no example dimension found."""
    (ia, oa), (ib, ob), (ir, o_r) = _leaves(a), _leaves(b), _leaves(r)
    if not len(ia) == len(ib) == len(ir) or not len(oa) == len(ob) == len(o_r):
        return None
    try:
        ins = [_example_dim(x, y, 2, 3, "an input") for x, y in zip(ia, ib)]
        outs = [_example_dim(x, y, 2, 3, "an output", check=False) for x, y in zip(oa, ob)]
    except FathomError:
        return None
    if not all(_follows(y, z, d) for y, z, d in zip(ib, ir, ins)):
        return None
    if not all(_head_same(x, y, d) for x, y, d in zip(oa, ob, outs)):
        return "joins"
    return None if all(_follows(y, z, d) for y, z, d in zip(ob, o_r, outs)) else "shift"


_HOW = {
    "joins": "its outputs for the first examples change when a further example joins the "
    "batch although its inputs do not (batch statistics, randomness, or an operation over "
    "the examples)",
    "shift": "with the examples of the batch shifted by one, its outputs for each example "
    "change although its inputs only moved (an operation along the example dimension, e.g. "
    "a cumsum or a running statistic over the batch)",
}


def check_mixing(
    calls_a: dict, calls_b: dict, calls_r: dict, finished: list[tuple[str, int]], types: dict
) -> None:
    """Refuse examples that mix across the batch (module docstring), naming the first module
    (completion order) where they start to: ``calls_a`` / ``calls_b`` / ``calls_r`` are the
    calls on 2, 3 and the 3 shifted examples, ``finished`` the shifted forward's ``(module,
    call)`` in completion order, ``types`` the module class names."""
    for name, c in finished:
        seen = [calls.get(name, []) for calls in (calls_a, calls_b, calls_r)]
        if any(c >= len(one) for one in seen):
            continue
        how = _culprit(*(one[c] for one in seen))
        if how is not None:
            raise FathomError(
                f"examples mix across the batch in module {name or ROOT!r} ({types[name]}): "
                f"{_HOW[how]}; per-example quantities are undefined there — run it in eval "
                "mode, or make each example's output depend on its own input alone"
            )
