"""Mask enumeration, MAC counts by hand, masked evaluation against a hand-written forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ciresan_reference import macs_per_example
from fathom.audit.costs import mask_macs
from fathom.audit.evaluate import evaluate_masks, load_scores, save_scores, scores_from_logits
from fathom.audit.masks import (
    enumerate_masks,
    full_mask_index,
    is_full_lattice,
    mask_label,
    removable_branch_count,
    sample_masks,
)
from fathom.errors import FathomError
from fathom.models.ciresan import CiresanMLP

torch.set_num_threads(1)
WIDTHS = (32, 24, 16, 12, 8)


def tiny_model(recipe: str = "sd_constant", dtype=torch.float64) -> CiresanMLP:
    torch.manual_seed(0)
    return CiresanMLP(widths=WIDTHS, recipe=recipe).to(dtype)


def test_enumeration_is_the_subset_lattice():
    masks = enumerate_masks(3)
    assert masks.shape == (8, 3)
    assert [mask_label(m) for m in masks] == [
        "000",
        "100",
        "010",
        "110",
        "001",
        "101",
        "011",
        "111",
    ]
    assert full_mask_index(masks) == 7
    assert is_full_lattice(masks)
    assert not is_full_lattice(masks[::-1])


def test_flop_counter_macs_agree_with_the_hand_formula_on_the_ciresan_mlp():
    model = tiny_model()
    masks = enumerate_masks(4)
    macs = mask_macs(model, masks, torch.zeros(3, 784, dtype=torch.uint8))
    assert macs == [macs_per_example(model, tuple(int(b) for b in row)) for row in masks]
    stem, head = 784 * 32, 8 * 10
    branch = [32 * 24, 24 * 16, 16 * 12, 12 * 8]  # 768, 384, 192, 96
    assert macs[0] == stem + head == 25168
    assert macs[15] == 25168 + 768 + 384 + 192 + 96 == 26608
    assert macs[int("0101", 2)] == 25168 + 768 + 192  # bits 0 and 2 set: mask "1010"
    for m, row in enumerate(masks):
        assert macs[m] == stem + head + sum(b for b, keep in zip(branch, row) if keep)


def test_plain_recipe_has_nothing_to_remove():
    with pytest.raises(FathomError, match="no removable branches"):
        removable_branch_count(tiny_model("plain"))


def test_too_many_masks_names_limit_and_sampling():
    with pytest.raises(FathomError, match=r"2\^13 = 8192.*4096.*sample"):
        enumerate_masks(13)


def test_sampled_masks_hold_full_singles_and_empty():
    masks = sample_masks(13, 40, seed=3)
    assert masks.shape == (40, 13)
    assert len({tuple(r) for r in masks}) == 40
    rows = {tuple(int(b) for b in r) for r in masks}
    assert tuple([1] * 13) in rows and tuple([0] * 13) in rows
    for removed in range(13):
        assert tuple(0 if j == removed else 1 for j in range(13)) in rows
    assert np.array_equal(masks, sample_masks(13, 40, seed=3))
    with pytest.raises(FathomError, match="at least 15"):
        sample_masks(13, 10, seed=0)


def hand_forward(model: CiresanMLP, x: torch.Tensor, mask: tuple[int, ...]) -> torch.Tensor:
    h = F.relu(model.stem(x.reshape(x.shape[0], -1).double() / 255))
    for block, keep in zip(model.blocks, mask):
        d = block.linear.out_features
        h = F.relu(h[:, :d] + keep * block.linear(h))
    return model.head(h)


def test_masked_logits_match_hand_forward_and_skip_branches():
    model = tiny_model()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (37, 28, 28), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (37,), generator=g)
    calls = [0] * 4
    for i, block in enumerate(model.blocks):
        block.linear.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    masks = enumerate_masks(4)
    scores = evaluate_masks(model, x, y, masks, batch_size=16)
    assert calls == [8 * 3] * 4  # each branch kept in 8 of 16 masks, 3 batches each
    for m, row in enumerate(masks):
        ref = hand_forward(model, x, tuple(int(b) for b in row)).detach()
        np.testing.assert_allclose(scores.logits[m], ref.float().numpy(), rtol=1e-5, atol=1e-6)
    assert model.training and all(b.mask is None and b.gain is None for b in model.branches())


def test_scores_against_torch_reference():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 50, 10, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (50,), generator=g)
    s = scores_from_logits(logits.float().numpy(), y.numpy(), enumerate_masks(2))
    z = torch.from_numpy(s.logits.astype(np.float64))
    for m in range(4):
        ce = F.cross_entropy(z[m], y, reduction="none").numpy()
        np.testing.assert_allclose(s.ce[m], ce, rtol=1e-12)
        other = z[m].clone()
        other[torch.arange(50), y] = -torch.inf
        margin = z[m][torch.arange(50), y] - other.max(dim=1).values
        np.testing.assert_allclose(s.margin[m], margin.numpy(), rtol=1e-12)
        assert np.array_equal(s.correct[m], (z[m].argmax(1) == y).numpy())
    assert s.damage()[3] == 0.0
    np.testing.assert_allclose(s.damage(), s.mean_ce() - s.mean_ce()[3])


def test_save_load_round_trip(tmp_path):
    model = tiny_model()
    x = torch.randint(0, 256, (20, 784), dtype=torch.uint8)
    y = torch.randint(0, 10, (20,))
    s = evaluate_masks(model, x, y, enumerate_masks(4))
    path = tmp_path / "scores.npz"
    save_scores(str(path), {"val": s, "test": s}, {"run_id": "r1", "params_sha256": "abc"})
    loaded, meta = load_scores(str(path))
    assert meta == {"run_id": "r1", "params_sha256": "abc"}
    assert np.array_equal(loaded["test"].logits, s.logits)
    assert np.array_equal(loaded["val"].correct, s.correct)
    np.testing.assert_allclose(loaded["val"].ce, s.ce, rtol=1e-6)


def test_mismatched_logits_shape_is_rejected():
    with pytest.raises(FathomError, match="do not match"):
        scores_from_logits(np.zeros((3, 5, 10)), np.zeros(5, dtype=np.int64), enumerate_masks(2))


def test_evaluate_masks_leaves_every_flag_and_buffer_as_found():
    """Once only the root's flag came back: a BatchNorm frozen in ``eval()`` inside a model in
    ``train()`` returned in ``train()``; a forward's in-place buffer update stayed."""
    from test_audit_costs import frozen_bn_model

    model = frozen_bn_model()
    flags = [(n, m.training) for n, m in model.named_modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    evaluate_masks(model, torch.randn(5, 3), torch.randint(0, 4, (5,)))
    assert [(n, m.training) for n, m in model.named_modules()] == flags
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
