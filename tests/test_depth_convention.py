"""``depth.convention``: Huang et al.'s scaling beside the default inverse-survival one,
against a float64 reference of both conventions' outputs (training draws, evaluation, masks),
through the controller, the config and a trained run read back by the audit's loader."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from conftest import synthetic_splits, tiny_config
from fathom.depth import DropSchedule, GateController, SkippableResidual, branch_mask
from fathom.depth.residual import CONVENTIONS, evaluation_gain, survival_gain
from fathom.errors import FathomError


def reference(x, w, b, p: float, convention: str, mode: str, kept: bool) -> torch.Tensor:
    """``x + g · (x Wᵀ + b)`` in float64, ``g`` written out per convention and mode:

    ===========  ==================  ===========================
    mode         inverse             huang
    ===========  ==================  ===========================
    train        kept / (1 - p)      kept
    eval         1                   1 - p
    mask         mask                mask · (1 - p)
    ===========  ==================  ===========================
    """
    s = 1.0 - p
    g = {
        ("inverse", "train"): (1.0 / s) if kept else 0.0,
        ("huang", "train"): 1.0 if kept else 0.0,
        ("inverse", "eval"): 1.0,
        ("huang", "eval"): s,
        ("inverse", "mask"): 1.0 if kept else 0.0,
        ("huang", "mask"): s if kept else 0.0,
    }[(convention, mode)]
    x, w, b = (t.double() for t in (x, w, b))
    return x + g * (x @ w.T + b)


def block(p: float, convention: str, seed: int) -> SkippableResidual:
    torch.manual_seed(seed)
    return SkippableResidual(nn.Linear(6, 6), p=p, seed=seed, convention=convention).double()


@settings(max_examples=60, deadline=None)
@given(
    p=st.floats(0.0, 0.95),
    seed=st.integers(0, 2**31 - 1),
    convention=st.sampled_from(CONVENTIONS),
)
def test_both_conventions_against_the_float64_reference(p, seed, convention):
    """Own draws in ``train()`` (the decisions replayed from the same generator), ``eval()``
    and both masks, each against :func:`reference`."""
    m = block(p, convention, seed)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    w, b = m.branch.weight.detach(), m.branch.bias.detach()
    replay = torch.Generator().manual_seed(seed)
    m.train()
    for _ in range(5):
        kept = bool(p == 0.0) or torch.rand((), generator=replay, dtype=torch.float64).item() >= p
        want = reference(x, w, b, p, convention, "train", kept)
        torch.testing.assert_close(m(x), want, rtol=1e-12, atol=1e-12)
    m.eval()
    torch.testing.assert_close(m(x), reference(x, w, b, p, convention, "eval", True))
    for mask in (0, 1):
        with branch_mask(m, [mask]):
            want = reference(x, w, b, p, convention, "mask", bool(mask))
            torch.testing.assert_close(m(x), want, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(p=st.floats(0.0, 0.95), convention=st.sampled_from(CONVENTIONS))
def test_evaluation_is_the_expectation_of_training(p, convention):
    """``(1 - p) · survival_gain(kept) + p · survival_gain(dropped) = evaluation_gain``: both
    conventions evaluate the branch at its expected training output."""
    mean = (1 - p) * survival_gain(True, p, convention) + p * survival_gain(False, p, convention)
    assert mean == pytest.approx(evaluation_gain(p, convention), rel=1e-12)


def test_the_controller_draws_the_same_decisions_with_gain_one_and_sets_p():
    """The same generator gives the same keep/drop decisions under both conventions; Huang's
    kept gain is exactly one, and each branch's ``p`` follows the schedule's epoch drawn."""
    schedule = DropSchedule("linear_decrease", (0.2, 0.5), end_epoch=4.0)
    inverse = [SkippableResidual(nn.Identity()) for _ in range(2)]
    huang = [SkippableResidual(nn.Identity()) for _ in range(2)]
    gi = GateController(inverse, schedule, seed=3)
    gh = GateController(huang, schedule, seed=3, convention="huang")
    assert [b.p for b in huang] == [0.2, 0.5] and {b.convention for b in huang} == {"huang"}
    for epoch in (0, 0, 1, 2, 2, 3):
        (ki, vi), (kh, vh) = gi.draw(epoch), gh.draw(epoch)
        assert ki == kh
        assert vh == tuple(1.0 if k else 0.0 for k in kh)
        probs = schedule.at(epoch)
        assert vi == tuple((1 / (1 - p)) if k else 0.0 for k, p in zip(ki, probs, strict=True))
        assert [b.p for b in huang] == list(probs)
    assert [b.p for b in inverse] == [0.0, 0.0]  # the default touches no branch


def test_an_unknown_convention_is_refused_with_the_choices():
    with pytest.raises(
        FathomError, match="unknown stochastic-depth convention 'huan'; use one of inverse, huang"
    ):
        SkippableResidual(nn.Identity(), convention="huan")
    with pytest.raises(
        FathomError, match="'inverse' or 'huang' \\(got 'huan'\\) \\(did you mean 'huang'"
    ):
        tiny_config(**{"depth.convention": "huan"})


def test_the_default_leaves_the_config_and_its_hash_as_before():
    """A config with the default convention dumps no ``depth`` section (its hash is the one
    every run written before had); ``huang`` is dumped and read back."""
    from fathom.base.io import config_digest
    from fathom.config import RunConfig

    cfg = tiny_config()
    dump = cfg.model_dump(mode="json")
    assert "depth" not in dump
    assert config_digest(dump) == config_digest(
        RunConfig.model_validate(dump).model_dump(mode="json")
    )
    huang = tiny_config(**{"depth.convention": "huang"})
    assert huang.model_dump(mode="json")["depth"] == {"convention": "huang"}
    assert RunConfig.model_validate(huang.model_dump(mode="json")).depth.convention == "huang"


def test_a_huang_run_trains_and_its_checkpoints_load_with_the_convention(tmp_path):
    """A trained ``huang`` run (sd_constant: p 0.1 to 0.4 by depth): its final checkpoint
    loads (audit, curvature) with every branch weighted by the survival of its last epoch,
    and the dense output equals the float64 reference block by block; the run differs from
    the inverse run trained from the same seed (another parameterisation)."""
    from fathom.depth import find_branches
    from fathom.rundir import RunDir
    from fathom.train.build import build_schedule
    from fathom.train.loop import train

    updates = {"optim.epochs": 2, "model.recipe": "sd_constant"}
    cfg = tiny_config(**updates, **{"depth.convention": "huang"})
    huang = train(cfg, tmp_path / "huang", splits=synthetic_splits())
    inverse = train(tiny_config(**updates), tmp_path / "inverse", splits=synthetic_splits())
    assert huang.status == inverse.status == "complete"
    assert huang.final_params != inverse.final_params
    model = RunDir(tmp_path / "huang").load_model("final", dtype=torch.float64)
    probs = build_schedule(cfg).at(1)  # the draws of epoch 2 are made at 1
    branches = find_branches(model)
    assert [b.p for b in branches] == pytest.approx(list(probs)) and max(probs) > 0
    assert {b.convention for b in branches} == {"huang"}
    b = branches[0]
    x = torch.randn(3, b.branch.in_features, dtype=torch.float64)
    want = b.bypass(x) + (1 - b.p) * b.branch(x)
    torch.testing.assert_close(b(x), want, rtol=1e-12, atol=1e-12)
