"""The ``gpt`` model kind (:mod:`fathom.models.gpt`): the block against a float64 reference
written from the formulas, causality, tied weights, LayerDrop that skips a block's work, the
token loss and scores against brute force, and the refusals."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from fathom.config import validate_run_config
from fathom.config.models import GPTConfig
from fathom.depth import find_branches
from fathom.errors import FathomError
from fathom.models import build_model, count_parameters
from fathom.models.gpt import GPT, block_drop_probs, drop_schedule, token_cross_entropy
from fathom.train.evaluate import token_scores


def tiny_gpt(layers: int = 2, width: int = 16, heads: int = 2, context: int = 8) -> GPT:
    torch.manual_seed(0)
    return GPT(vocab=256, context=context, layers=layers, width=width, heads=heads)


def reference_forward(model: GPT, x: torch.Tensor, gains: list[float]) -> torch.Tensor:
    """The module docstring's network in float64, from the formulas, block by block."""
    sd = {k: v.double() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    t = x.shape[1]
    d = sd["wte.weight"].shape[1]
    heads = model.blocks[0].branch.attn.heads
    dh = d // heads

    def ln(h, prefix):
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        return (h - mu) / torch.sqrt(var + 1e-5) * sd[f"{prefix}.weight"] + sd[f"{prefix}.bias"]

    def lin(h, prefix):
        return h @ sd[f"{prefix}.weight"].T + sd[f"{prefix}.bias"]

    def attn(h, prefix):
        q, k, v = lin(h, f"{prefix}.c_attn").split(d, dim=-1)
        out = torch.zeros_like(h)
        for head in range(heads):
            s = slice(head * dh, (head + 1) * dh)
            scores = q[..., s] @ k[..., s].transpose(-1, -2) / math.sqrt(dh)
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
            weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
            out[..., s] = weights @ v[..., s]
        return lin(out, f"{prefix}.c_proj")

    def mlp(h, prefix):
        u = lin(h, f"{prefix}.c_fc")
        return lin(0.5 * u * (1 + torch.erf(u / math.sqrt(2))), f"{prefix}.c_proj")

    h = sd["wte.weight"][x.long()] + sd["wpe.weight"][:t]
    for i, g in enumerate(gains):
        p = f"blocks.{i}.branch"
        if g == 0.0:
            continue
        a = attn(ln(h, f"{p}.ln_1"), f"{p}.attn")
        mid = h + a  # the pre-LN block: h + attn(ln_1 h), then + mlp(ln_2 ·)
        block = mid + mlp(ln(mid, f"{p}.ln_2"), f"{p}.mlp")
        h = h + g * (block - h)
    h = ln(h, "ln_f")
    return h @ sd["wte.weight"].T  # tied output weights


def test_forward_matches_the_float64_reference():
    model = tiny_gpt().double()
    x = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(1))
    model.eval()
    got = model(x)
    assert got.shape == (3, 8, 256)
    torch.testing.assert_close(got, reference_forward(model, x, [1.0, 1.0]), rtol=1e-10, atol=1e-10)


def test_a_dropped_block_is_not_computed_and_gets_no_gradient():
    model = tiny_gpt().double()
    x = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(2))
    calls: list[int] = []
    for i, block in enumerate(model.blocks):
        block.branch.register_forward_hook(lambda m, a, o, i=i: calls.append(i))
    model.train()
    model.blocks[0].gain = 0.0
    model.blocks[1].gain = 1.25  # a kept block's survival gain 1 / (1 - p), p = 0.2
    out = model(x)
    assert calls == [1]
    torch.testing.assert_close(
        out, reference_forward(model, x, [0.0, 1.25]), rtol=1e-10, atol=1e-10
    )
    out.sum().backward()
    assert all(p.grad is None for p in model.blocks[0].parameters())
    assert all(p.grad is not None for p in model.blocks[1].parameters())


@given(t=st.integers(min_value=1, max_value=7), seed=st.integers(0, 2**16))
def test_logits_never_see_a_later_token(t, seed):
    model = tiny_gpt().eval()
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (1, 8), generator=g)
    y = x.clone()
    y[0, t:] = torch.randint(0, 256, (8 - t,), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :t], model(y)[:, :t], rtol=0, atol=0)


def test_output_weights_are_the_embedding():
    model = tiny_gpt()
    assert model.lm_head.weight is model.wte.weight
    separate = sum(p.numel() for n, p in model.named_parameters(remove_duplicate=False))
    assert count_parameters(model) == separate - 256 * 16


def test_every_block_is_a_skippable_residual_and_init_is_nanogpt():
    model = GPT(vocab=256, context=8, layers=3, width=32, heads=4)
    assert len(find_branches(model)) == 3
    proj = torch.cat([b.branch.mlp.c_proj.weight.flatten() for b in model.blocks])
    assert proj.std().item() == pytest.approx(0.02 / math.sqrt(6), rel=0.1)
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert all(b.branch.attn.c_attn.bias.abs().sum() == 0 for b in model.blocks)


# ---------------------------------------------------------------- loss and scores


@given(seed=st.integers(0, 2**16), ignored=st.integers(0, 5))
def test_token_cross_entropy_matches_brute_force(seed, ignored):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (2, 3), generator=g)
    y.view(-1)[:ignored] = -1
    terms = [
        -torch.log_softmax(logits[n, t], dim=0)[y[n, t]]
        for n in range(2)
        for t in range(3)
        if y[n, t] != -1
    ]
    if not terms:
        return
    ref = sum(terms) / len(terms)
    assert token_cross_entropy(logits, y).item() == pytest.approx(ref.item(), rel=1e-12)
    total = token_cross_entropy(logits, y, reduction="sum").item()
    assert total == pytest.approx(sum(terms).item(), rel=1e-12)


def test_token_loss_refuses_a_classifier_layout():
    with pytest.raises(FathomError, match=r"must be \[N, T, V\]"):
        token_cross_entropy(torch.zeros(4, 10), torch.zeros(4, dtype=torch.int64))


def test_token_scores_match_brute_force_over_batches():
    model = tiny_gpt().double().eval()
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (5, 8), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 256, (5, 8), generator=g)
    acc, ce = token_scores(model, x, y, batch_size=2)
    with torch.no_grad():
        z = model(x)
    ref_ce = F.cross_entropy(z.reshape(-1, 256), y.reshape(-1)).item()
    ref_acc = (z.argmax(-1) == y).double().mean().item()
    assert ce == pytest.approx(ref_ce, rel=1e-12) and acc == ref_acc


# ---------------------------------------------------------------- config and build


def test_vocab_and_context_come_from_the_data_and_must_cover_it():
    model = build_model(GPTConfig(layers=1, width=8, heads=2), 256, input_shape=(16,))
    assert (model.vocab, model.context) == (256, 16)
    with pytest.raises(FathomError, match="model.vocab = 100 is smaller"):
        build_model(GPTConfig(layers=1, width=8, heads=2, vocab=100), 256, input_shape=(16,))
    with pytest.raises(FathomError, match="model.context = 8 is shorter"):
        build_model(GPTConfig(layers=1, width=8, heads=2, context=8), 256, input_shape=(16,))
    with pytest.raises(FathomError, match="reads windows of tokens"):
        build_model(GPTConfig(layers=1, width=8, heads=2), 10, input_shape=(28, 28))


def test_a_longer_window_than_the_positions_is_refused():
    with pytest.raises(FathomError, match="exceeds its 8 learned positions"):
        tiny_gpt()(torch.zeros(1, 9, dtype=torch.long))


def test_layerdrop_rules():
    assert block_drop_probs(GPTConfig(layers=3, layerdrop=0.3)) == (0.3, 0.3, 0.3)
    linear = block_drop_probs(GPTConfig(layers=3, layerdrop=0.3, layerdrop_rule="linear"))
    assert linear == pytest.approx((0.1, 0.2, 0.3))
    assert block_drop_probs(GPTConfig(layers=2, drop_probs=(0.0, 0.5))) == (0.0, 0.5)
    assert drop_schedule(GPTConfig(layers=2), epochs=3) is None
    assert drop_schedule(GPTConfig(layers=2, layerdrop=0.1), epochs=3).at(2.0) == (0.1, 0.1)


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ({"width": 10, "heads": 3}, "not a multiple of heads"),
        ({"layerdrop": 1.0}, "layerdrop must be in"),
        ({"layers": 2, "drop_probs": [0.1]}, "one per block"),
        ({"layers": 1, "layerdrop": 0.1, "drop_probs": [0.1]}, "not both"),
    ],
)
def test_bad_model_configs_are_refused(model, needle):
    with pytest.raises(FathomError, match=needle):
        validate_run_config(
            {"data": {"dataset": "moby-dick", "context": 8}, "model": {"kind": "gpt", **model}}
        )


def test_a_language_model_and_its_data_go_together():
    with pytest.raises(FathomError, match="needs a text dataset"):
        validate_run_config({"model": {"kind": "gpt"}})
    with pytest.raises(FathomError, match="train a next-token model"):
        validate_run_config({"data": {"dataset": "moby-dick", "context": 8}})
    with pytest.raises(FathomError, match="stop.target_test_acc"):
        validate_run_config(
            {
                "data": {"dataset": "moby-dick", "context": 8},
                "model": {"kind": "gpt"},
                "stop": {"target_test_acc": 0.5},
            }
        )


def test_the_gpu_preset_builds_and_takes_a_step_on_the_cpu():
    """``gpt-full`` (the GPU preset) validates, builds at its stated size (6 blocks of width
    384, context 256: nanoGPT's shakespeare_char size) and one AdamW step on one window of
    its context lowers the loss on that window: the preset is runnable, not only declared."""
    from fathom.study.family import load_config

    cfg, _ = load_config("gpt-full")
    assert (cfg.model.layers, cfg.model.width, cfg.data.context) == (6, 384, 256)
    torch.manual_seed(0)
    model = build_model(cfg.model, 256, input_shape=(cfg.data.context,))
    width, ctx, vocab = 384, 256, 256
    per_block = 12 * width * width + 13 * width  # attention 4d²+4d, MLP 8d²+5d, two LNs 4d
    assert count_parameters(model) == vocab * width + ctx * width + 6 * per_block + 2 * width
    x = torch.randint(0, vocab, (1, ctx + 1))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    model.train()
    before = token_cross_entropy(model(x[:, :-1]), x[:, 1:])
    before.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        after = token_cross_entropy(model(x[:, :-1]), x[:, 1:])
    assert model(x[:, :-1]).shape == (1, ctx, vocab)
    assert after < before
