"""Reduced-network timing and grouped routed inference."""

from __future__ import annotations

import numpy as np
import torch

from fathom.audit.evaluate import mask_logits
from fathom.audit.masks import enumerate_masks
from fathom.audit.speed import routed_forward, time_masks, time_routed
from fathom.models.ciresan import CiresanMLP

torch.set_num_threads(1)


def tiny():
    torch.manual_seed(0)
    return CiresanMLP(widths=(32, 24, 16, 12, 8), recipe="sd_constant")


def test_routed_forward_equals_each_examples_own_mask():
    model = tiny()
    masks = enumerate_masks(4)
    x = torch.randint(0, 256, (40, 784), dtype=torch.uint8)
    assign = np.random.default_rng(0).integers(0, 16, 40)
    routed = routed_forward(model, x, assign, masks, batch_size=7).numpy()
    every = mask_logits(model, x, masks)
    np.testing.assert_allclose(routed, every[assign, np.arange(40)], rtol=1e-6, atol=1e-6)
    assert all(b.mask is None and b.gain is None for b in model.branches()) and model.training


def test_timings_have_one_entry_per_mask_and_dense_reference():
    model = tiny()
    masks = enumerate_masks(4)
    x = torch.randint(0, 256, (16, 784), dtype=torch.uint8)
    t = time_masks(model, x, masks, full_index=15, repeats=2)
    assert len(t.seconds) == 16 and all(s > 0 for s in t.seconds)
    assert t.dense_seconds == t.seconds[15] and t.speedups()[15] == 1.0
    r = time_routed(model, x, lambda xb: np.zeros(xb.shape[0], dtype=int), masks, 8, repeats=1)
    assert r.dense_seconds > 0 and r.routed_seconds > 0
    assert r.to_dict()["routed_over_dense"] == r.slowdown


def test_timings_report_median_iqr_and_per_repeat_speedups():
    model = tiny()
    masks = enumerate_masks(4)
    x = torch.randint(0, 256, (16, 784), dtype=torch.uint8)
    t = time_masks(model, x, masks, full_index=15, repeats=5).to_dict()
    assert t["spread"] == "interquartile range over repeats"
    per = t["per_repeat_seconds"]
    assert len(per) == 16 and all(len(p) == 5 for p in per)
    for m in range(16):
        q1, med, q3 = np.quantile(per[m], [0.25, 0.5, 0.75])
        assert t["median_seconds"][m] == med and t["seconds_iqr"][m] == [q1, q3]
        ratios = [d / s for d, s in zip(per[15], per[m], strict=True)]  # same repeat
        sp = t["speedup"][m]
        assert sp["median"] == t["speedup_vs_dense"][m] == np.median(ratios)
        assert (sp["q1"], sp["q3"]) == tuple(np.quantile(ratios, [0.25, 0.75]))
        assert sp["verdict"] == (
            "faster" if sp["q1"] > 1 else "slower" if sp["q3"] < 1 else "not established"
        )
    assert t["speedup"][15]["verdict"] == "not established"  # dense against itself: all 1
    r = time_routed(model, x, lambda xb: np.zeros(xb.shape[0], dtype=int), masks, 8, repeats=3)
    d = r.to_dict()
    ratios = [a / b for a, b in zip(d["routed_per_repeat_seconds"], d["dense_per_repeat_seconds"])]
    assert d["routed_over_dense"] == np.median(ratios)
    assert d["routed_over_dense_iqr"] == list(np.quantile(ratios, [0.25, 0.75]))
