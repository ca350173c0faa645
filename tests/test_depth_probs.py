"""Drop probabilities of any real scalar type, and compiled self-seeding modules.

Regression tests for two defects: ``np.float32(0.2)`` / ``torch.tensor(0.2)`` were refused as
drop probabilities, and a compiled (inductor) ``SkippableResidual(seed=None)`` seeded its
generator from a traced ``torch.randint`` (inductor's own RNG), so it dropped other branches
than the eager module from the same global RNG state.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from fathom.depth import (
    DropSchedule,
    SkippableResidual,
    check_drop_prob,
    huang_linear_in_depth,
    set_drop_probs,
)
from fathom.errors import FathomError

SCALAR_TYPES = {
    "float": float,
    "np.float32": np.float32,
    "np.float64": np.float64,
    "np.float16": np.float16,
    "np.0d-array": lambda v: np.array(v),
    "torch.float32": lambda v: torch.tensor(v, dtype=torch.float32),
    "torch.float64": lambda v: torch.tensor(v, dtype=torch.float64),
    "torch.bfloat16": lambda v: torch.tensor(v, dtype=torch.bfloat16),
}


def _value(p) -> float:
    """The exact value of a scalar ``p`` in float64, computed independently of fathom."""
    if isinstance(p, torch.Tensor):
        return p.to(torch.float64).tolist()
    return np.asarray(p).astype(np.float64).tolist()


def _model(p=0.0) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), SkippableResidual(nn.Linear(4, 4), p=p, seed=0))


@settings(max_examples=60)
@given(kind=st.sampled_from(sorted(SCALAR_TYPES)), v=st.floats(0.0, 0.99))
@example(kind="np.float32", v=0.2)
@example(kind="torch.float32", v=0.2)
@example(kind="np.float64", v=0.0)
def test_every_real_scalar_in_unit_interval_is_a_drop_probability_everywhere(kind, v):
    p = SCALAR_TYPES[kind](v)
    exact = _value(p)
    assert check_drop_prob(p) == exact
    res = SkippableResidual(nn.Linear(3, 3), p=p)
    assert type(res.p) is float and res.p == exact
    res.p = p
    assert type(res.p) is float and res.p == exact
    model = _model()
    set_drop_probs(model, [p])
    assert type(model[1].p) is float and model[1].p == exact
    schedule = DropSchedule("linear_decrease", (p, 0.1), end_epoch=4)
    assert schedule.probs == (exact, 0.1) and all(type(q) is float for q in schedule.at(1))
    assert schedule.at(2) == (exact * 0.5, 0.1 * 0.5)
    assert huang_linear_in_depth(2, p) == (exact / 2, exact)


def test_numpy_float32_and_torch_scalar_probabilities_drop_like_the_float():
    """The defect: both were refused. Same value, same decisions as the Python float."""
    runs = []
    for p in (float(np.float32(0.3)), np.float32(0.3), torch.tensor(0.3, dtype=torch.float32)):
        torch.manual_seed(0)
        res = SkippableResidual(nn.Linear(3, 3), p=p, seed=5)
        x = torch.randn(2, 3)
        runs.append([res(x).sum().item() for _ in range(30)])
    assert runs[0] == runs[1] == runs[2] and len(set(runs[0])) == 2
    set_drop_probs(_model(), np.array([0.25]))  # a numpy row of one probability per branch
    set_drop_probs(_model(), torch.tensor([0.25]))


BAD = {
    "one": (1.0, "outside"),
    "negative": (-0.1, "outside"),
    "nan": (float("nan"), "outside"),
    "np-nan": (np.float32("nan"), "outside"),
    "torch-nan": (torch.tensor(float("nan")), "outside"),
    "torch-one": (torch.tensor(1.0), "outside"),
    "np-inf": (np.float64("inf"), "outside"),
    "bool": (True, "not a real scalar"),
    "np-bool": (np.bool_(False), "not a real scalar"),
    "torch-bool": (torch.tensor(False), "not a real scalar"),
    "string": ("0.1", "not a real scalar"),
    "complex": (0.1 + 0j, "not a real scalar"),
    "list": ([0.1], "not a real scalar"),
    "np-1d": (np.array([0.1]), "not a real scalar"),
    "torch-1d": (torch.tensor([0.1]), "not a real scalar"),
    "torch-2d": (torch.full((1, 1), 0.1), "not a real scalar"),
    "none": (None, "not a real scalar"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_non_scalar_nan_and_out_of_range_probabilities_are_refused_by_name(name):
    bad, match = BAD[name]
    with pytest.raises(FathomError, match=match) as err:
        SkippableResidual(nn.Linear(3, 3), p=bad)
    assert "drop probability" in str(err.value) and "SkippableResidual" in str(err.value)
    model = _model(0.2)
    with pytest.raises(FathomError, match=match):
        model[1].p = bad
    with pytest.raises(FathomError, match=f"branch 0.*{match}|{match}.*branch 0"):
        set_drop_probs(model, [bad])
    assert model[1].p == 0.2  # nothing changed by the refusals
    with pytest.raises(FathomError, match=f"branch 1 of the drop schedule.*{match}|{match}"):
        DropSchedule("constant", (0.1, bad))
    with pytest.raises(FathomError, match=match):
        huang_linear_in_depth(3, bad)


class _Ones(nn.Module):
    """A branch whose output is all ones, so ``y - x`` is exactly this forward's gain."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(x)


def _gains(model: nn.Module, x: torch.Tensor, n: int) -> list[float]:
    """The gain of each of ``n`` forwards: ``y - x`` (exact: 0 or 1 / (1 - p))."""
    return [float((model(x) - x)[0, 0]) for _ in range(n)]


def test_compiled_unseeded_module_draws_the_eager_decisions_inductor():
    """torch.compile(backend="inductor"), seed=None: the same gains and RNG states as eager.

    Before the fix the seed's ``torch.randint`` was traced and inductor lowered it to its own
    RNG, so the compiled generator was seeded differently (the gains differed at 9 of these 16
    forwards).
    """
    torch._dynamo.reset()
    x = torch.zeros(2, 3)
    eager, plain = SkippableResidual(_Ones(), p=0.5), SkippableResidual(_Ones(), p=0.5)
    compiled = torch.compile(plain, backend="inductor")
    torch.manual_seed(1234)
    expected = _gains(eager, x, 16)
    eager_rng = torch.get_rng_state()
    torch.manual_seed(1234)
    got = _gains(compiled, x, 16)
    assert got == expected
    assert torch.equal(torch.get_rng_state(), eager_rng)
    assert torch.equal(eager.generator.get_state(), plain.generator.get_state())
    assert set(expected) == {0.0, 2.0}
    torch._dynamo.reset()


def test_eager_seeding_still_draws_one_randint_from_the_global_generator():
    """Anchor: eagerly, a ``seed=None`` module seeds exactly as before the compile fix."""
    torch.manual_seed(99)
    seed = int(torch.randint(0, 2**62, ()).item())  # the pre-fix rule, written out here
    reference = torch.Generator().manual_seed(seed)
    torch.rand((), generator=reference, dtype=torch.float64)  # the first forward's draw
    after = torch.get_rng_state()
    res = SkippableResidual(_Ones(), p=0.5)
    torch.manual_seed(99)
    res(torch.zeros(1, 2))
    assert torch.equal(torch.get_rng_state(), after)
    assert torch.equal(res.generator.get_state(), reference.get_state())
