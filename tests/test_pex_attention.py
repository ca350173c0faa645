"""nn.MultiheadAttention's closed-form per-example gradients (fathom.pex_attention) and its
fall-back to the generic torch.func path, against float64 vmap(grad) brute force."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fathom.pex
import fathom.pex_attention
from fathom.curvature import exact_diagonals
from model_zoo import brute_force_grads
from test_curvature_zoo import RTOL, brute_force, relative_error
from test_seam import rel_err, seam_grads

torch.set_num_threads(1)
LENGTH, CLASSES = 5, 3


class Attend(nn.Module):
    """Tokens -> embedding -> one attention call of the given ``mode`` -> mean -> logits."""

    def __init__(self, mode: str, bias: bool = True) -> None:
        super().__init__()
        self.mode = mode
        self.embed = nn.Embedding(7, 8)
        self.attn = nn.MultiheadAttention(8, 2, bias=bias, batch_first=True)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        if self.mode == "cross":  # key/value: a shorter, different sequence
            out, _ = self.attn(h, torch.tanh(h[:, :3]), h[:, :3].flip(1), need_weights=False)
        elif self.mode == "causal_mask":
            mask = torch.triu(torch.full((LENGTH, LENGTH), float("-inf"), dtype=h.dtype), 1)
            out, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        elif self.mode == "weights_used":
            out, w = self.attn(h, h, h, need_weights=True)
            out = out + w.sum(-1, keepdim=True)  # the attention weights receive gradient
        else:  # "weights_unused"
            out, _ = self.attn(h, h, h)
        return self.head(out.mean(1))


MODES = [("cross", True), ("cross", False), ("causal_mask", True), ("weights_used", True)]
MODES += [("weights_unused", True)]


def _case(mode: str, bias: bool):
    torch.manual_seed(0)
    model = Attend(mode, bias).double().eval()
    g = torch.Generator().manual_seed(1)
    return model, torch.randint(0, 7, (4, LENGTH), generator=g), torch.tensor([0, 2, 1, 2])


@pytest.mark.parametrize(("mode", "bias"), MODES, ids=[f"{m}-bias{int(b)}" for m, b in MODES])
def test_attention_per_example_grads_and_diagonals_match_brute_force(mode, bias, monkeypatch):
    model, x, y = _case(mode, bias)
    used = []
    real = fathom.pex_attention.attention_grads

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        used.append(out is not None)
        return out

    monkeypatch.setattr(fathom.pex, "attention_grads", spy)
    want = brute_force_grads(model, x, y)
    seam, calls, cots = seam_grads(model, x, y)
    layer = seam.layer("attn")
    assert layer.kind == "attention"
    got = fathom.pex.per_example_grads(layer, calls["attn"], cots["attn"], len(y))
    for local, q in zip(layer.params, layer.qualified, strict=True):
        assert rel_err(got[local], want[q]) <= 1e-9, local
    closed_form = mode in ("cross", "weights_unused")
    assert used and all(u == closed_form for u in used), used
    ref = brute_force(model, x, y)
    diags = exact_diagonals(model, x, y)
    for kind in ref:
        for name, t in ref[kind].items():
            assert relative_error(diags[kind][name], t) <= RTOL, (kind, name)
