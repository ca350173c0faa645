"""The discovery's fast paths answer exactly what they stand in for.

``fathom.seam.examples.close`` stands in for ``torch.allclose`` (the self-check and the
independence checks compare hundreds of tensors per discovery) and
``fathom.seam.discovery.call_tensors`` for the tensors among ``pytree.tree_leaves`` of a
torch call's arguments (the use recorder scans every torch call of the discovery forwards).
Both are checked against the originals on generated inputs: NaN, infinities, signed zeros,
broadcasting shapes, empty tensors, and nested or flat arguments.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils import _pytree as pytree

from fathom.seam.discovery import call_tensors
from fathom.seam.examples import close

_SPECIAL = [0.0, -0.0, 1.0, -1.0, 1e-30, 1e30, float("inf"), float("-inf"), float("nan")]


@st.composite
def _pairs(draw):
    n = draw(st.integers(0, 6))
    value = st.one_of(st.sampled_from(_SPECIAL), st.floats(-1e3, 1e3, width=32))
    a = torch.tensor(draw(st.lists(value, min_size=n, max_size=n)), dtype=torch.float32)
    noise = st.one_of(st.just(0.0), st.floats(-1e-2, 1e-2), st.sampled_from(_SPECIAL))
    eps = torch.tensor(draw(st.lists(noise, min_size=n, max_size=n)), dtype=torch.float32)
    b = a + eps if draw(st.booleans()) else a.clone()
    if n and draw(st.booleans()):
        b = b[:1]  # a shape that broadcasts
    return a, b


@settings(max_examples=400, deadline=None)
@given(
    pair=_pairs(),
    rtol=st.sampled_from([0.0, 1e-4, 1e-3]),
    atol=st.sampled_from([0.0, 1e-6, 1e-3, 1.0]),
)
def test_close_answers_as_torch_allclose(pair, rtol, atol) -> None:
    a, b = pair
    assert close(a, b, rtol=rtol, atol=atol) == torch.allclose(a, b, rtol=rtol, atol=atol)


def test_close_on_a_nan_or_an_infinity() -> None:
    """The fast path must not accept what allclose rejects (NaN never close, equal
    infinities close)."""
    nan, inf = torch.tensor([float("nan")]), torch.tensor([float("inf")])
    assert not close(nan, nan, rtol=1e-3, atol=1.0)
    assert close(inf, inf, rtol=1e-3, atol=1.0)
    assert not close(inf, torch.tensor([1.0]), rtol=1e-3, atol=1.0)


_T = [torch.zeros(1), torch.ones(2), torch.nn.Parameter(torch.zeros(3))]
_atoms = st.one_of(
    st.integers(-3, 3),
    st.floats(-1, 1),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.sampled_from([torch.float32, torch.device("cpu")]),
)
_leaf = st.one_of(_atoms, st.sampled_from(range(len(_T))).map(lambda i: _T[i]))
_args = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=2), inner, max_size=2),
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    args=st.lists(_args, max_size=4).map(tuple),
    kwargs=st.dictionaries(st.sampled_from(["bias", "out", "dim"]), _args, max_size=2),
)
def test_call_tensors_finds_what_pytree_finds(args, kwargs) -> None:
    want = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    got = call_tensors(args, kwargs)
    assert [id(t) for t in got] == [id(t) for t in want]
