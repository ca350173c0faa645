"""A small GPT whose blocks are skippable residuals (LayerDrop that saves its work).

The network (nanoGPT's ``model.py``, pre-LayerNorm, no dropout)::

    h_0 = wte(x) + wpe(0 .. T-1)                        token + learned position embeddings
    h_l = h_{l-1} + g_l · branch_l(h_{l-1})             l = 1 .. L, each a SkippableResidual
        branch_l(h) = a + mlp(ln_2(h + a)),  a = attn(ln_1(h))
    logits = ln_f(h_L) @ wte.weightᵀ                    [N, T, V], output tied to the embedding

``branch_l`` is exactly a pre-LN block's two residual additions,
``h + attn(ln_1(h))`` then ``+ mlp(ln_2(·))``, written as one residual ``h + branch(h)`` so
the whole block is one :class:`~fathom.depth.SkippableResidual`: with gain ``g_l = 0``
(LayerDrop, Fan et al. 2019; a dropped block) neither its attention nor its MLP is computed,
forward or backward; a kept block in training has Fathom's survival gain ``1 / (1 - p_l)``
(:mod:`fathom.depth`), dense evaluation gain one. ``attn`` is causal multi-head
self-attention (``softmax(q kᵀ / sqrt(d_head) + causal mask) v``,
:func:`torch.nn.functional.scaled_dot_product_attention`); ``mlp(h) = W_2 gelu(W_1 h)`` with
a hidden width ``4 d``. Initialization as nanoGPT: every weight ``N(0, 0.02²)``, the two
projections into the residual stream ``N(0, (0.02 / sqrt(2 L))²)``, biases zero.

The loss (:func:`token_cross_entropy`) is the token-level cross-entropy over the valid
positions, in nats per token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fathom.config.models import GPTConfig
from fathom.depth import DropSchedule, SkippableResidual, huang_linear_in_depth
from fathom.errors import FathomError
from fathom.models.specs import DataShape

IGNORE_INDEX = -1
"""A target of ``-1`` marks a position that is not scored (none in Fathom's own windows)."""


def token_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """``(1/M) sum_{(n,t) valid} -log softmax(z_{n,t})_{y_{n,t}}`` in nats per token, over the
    ``M`` positions whose target is not :data:`IGNORE_INDEX` (``reduction="sum"``: the sum).

    ``logits`` ``[N, T, V]``, ``targets`` ``[N, T]`` int64; every position's logits are one
    row of :func:`torch.nn.functional.cross_entropy`.
    """
    if logits.dim() != 3 or logits.shape[:2] != targets.shape:
        raise FathomError(
            f"a language model's logits must be [N, T, V] with targets [N, T], got "
            f"{list(logits.shape)} for targets {list(targets.shape)}; return one row of "
            "vocabulary logits per position"
        )
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction=reduction,
    )


def token_loss():
    """:func:`token_cross_entropy` as a :class:`fathom.losses.Loss` (cross-entropy,
    ``class_dim=-1`` over ``[N, T, V]``, ``ignore_index`` :data:`IGNORE_INDEX`, mean over the
    valid positions): the loss the instruments and ``fathom curvature`` read a language
    model's run with; one "example" is one sequence window."""
    from fathom.losses.kinds import make_loss

    return make_loss("cross_entropy", ignore_index=IGNORE_INDEX, class_dim=-1, reduction="mean")


class CausalSelfAttention(nn.Module):
    """``W_o · concat_h softmax(q_h k_hᵀ / sqrt(d_head) + causal) v_h`` over ``[N, T, d]``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(n, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(n, t, d))

    def extra_repr(self) -> str:
        return f"heads={self.heads}"


class MLP(nn.Module):
    """``W_2 gelu(W_1 x)``, hidden width ``4 d``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class BlockBranch(nn.Module):
    """A pre-LN block's residual branch: ``a + mlp(ln_2(x + a))`` with ``a = attn(ln_1(x))``,
    so that ``x + branch(x)`` is the block ``x + attn(ln_1 x)``, then ``+ mlp(ln_2 ·)``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attn(self.ln_1(x))
        return a + self.mlp(self.ln_2(x + a))


class GPT(nn.Module):
    """The module docstring's network; ``forward(x)``: tokens ``[N, T]`` (any integer dtype,
    ``T <= context``) -> logits ``[N, T, vocab]``."""

    def __init__(self, vocab: int, context: int, layers: int, width: int, heads: int) -> None:
        super().__init__()
        self.vocab, self.context = vocab, context
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(
            SkippableResidual(BlockBranch(width, heads)) for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one tensor, counted once
        self._init_weights(layers)

    def _init_weights(self, layers: int) -> None:
        for name, p in self.named_parameters():
            if p.dim() < 2:
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                continue
            std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if t > self.context:
            raise FathomError(
                f"GPT: a window of {t} tokens exceeds its {self.context} learned positions; "
                "build it with model.context >= data.context"
            )
        idx = x.long()
        h = self.wte(idx) + self.wpe(torch.arange(t, device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.ln_f(h))


def build(cfg: GPTConfig, shape: DataShape) -> GPT:
    """The ``gpt`` kind's builder (:mod:`fathom.config.model_kinds`): vocabulary and context
    from the data (``classes`` = the data's vocabulary, ``input_shape = (T,)``) unless the
    config gives larger ones; smaller ones are refused."""
    assert shape.classes is not None and shape.input_shape is not None
    if len(shape.input_shape) != 1:
        raise FathomError(
            f"model.kind 'gpt' reads windows of tokens [N, T]; the data's examples have shape "
            f"{list(shape.input_shape)}: train it on a text dataset (moby-dick, text)"
        )
    data_vocab, data_context = shape.classes, shape.input_shape[0]
    vocab = cfg.vocab if cfg.vocab is not None else data_vocab
    context = cfg.context if cfg.context is not None else data_context
    if vocab < data_vocab:
        raise FathomError(
            f"model.vocab = {vocab} is smaller than the data's vocabulary of {data_vocab} "
            f"tokens: the embedding has no row for tokens >= {vocab}; remove model.vocab (the "
            f"data's) or set it >= {data_vocab}"
        )
    if context < data_context:
        raise FathomError(
            f"model.context = {context} is shorter than data.context = {data_context}: the "
            "windows have positions the model has no embedding for; remove model.context (the "
            f"data's) or set it >= {data_context}"
        )
    return GPT(vocab, context, cfg.layers, cfg.width, cfg.heads)


def block_drop_probs(cfg: GPTConfig) -> tuple[float, ...]:
    """The blocks' drop probabilities: ``drop_probs``, else ``layerdrop`` for every block
    (``uniform``) or ``p_l = l / L · layerdrop`` (``linear``)."""
    if cfg.drop_probs is not None:
        return tuple(cfg.drop_probs)
    if cfg.layerdrop_rule == "linear":
        return huang_linear_in_depth(cfg.layers, cfg.layerdrop)
    return (cfg.layerdrop,) * cfg.layers


def drop_schedule(cfg: GPTConfig, epochs: int) -> DropSchedule | None:
    """LayerDrop's constant per-block schedule (:func:`block_drop_probs`); ``None`` when every
    probability is zero (dense training)."""
    probs = block_drop_probs(cfg)
    return DropSchedule("constant", probs) if any(probs) else None
