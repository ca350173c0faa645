"""Models on the seam's edges, as data, and independent float64 references.

Every case is a dict: ``id``, ``build`` (seeded, returns an ``nn.Module``), ``x(n, g)`` and
``path`` (``{layer name: text its coverage line must contain}``). The references never use
the seam nor ``torch.func``: a Python loop over examples with ``torch.autograd.grad`` on
the model's own forward, one example at a time.
"""

from __future__ import annotations

import types
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations, prune

CLASSES = 3


def _mlp(first: nn.Module, width: int = 8) -> nn.Module:
    return nn.Sequential(first, nn.Tanh(), nn.Linear(width, CLASSES))


def hooked_linear() -> nn.Module:
    model = _mlp(nn.Linear(6, 8))
    model[0].register_forward_hook(
        lambda m, a, o: 2 * o
    )  # a hooked output: the fast path once reported 0.25x the GGN
    return model


def pre_hooked_linear() -> nn.Module:
    model = _mlp(nn.Linear(6, 8))
    model[0].register_forward_pre_hook(lambda m, a: (3 * a[0] + 0.5,))
    return model


class ConvNet(nn.Module):
    def __init__(self, conv: nn.Module, norm: nn.Module) -> None:
        super().__init__()
        self.conv, self.norm, self.head = conv, norm, nn.Linear(3 * 16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.conv(x)))
        return self.head(F.avg_pool2d(h, 2).flatten(1))


def hooked_conv_bn() -> nn.Module:
    model = ConvNet(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3))
    model.conv.register_forward_hook(lambda m, a, o: o * 1.5 + 0.1)
    model.norm.register_forward_hook(lambda m, a, o: o - 0.2)
    return model


def hooked_layernorm() -> nn.Module:
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, CLASSES))
    model[1].register_forward_hook(lambda m, a, o: 3 * o)
    return model


class RootBias(nn.Module):
    """A root parameter passed into ``attn``, which owns its own biases: the root parameter is
    attributed to itself, never to ``attn``'s biases."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.attn_bias = nn.Parameter(0.3 * torch.randn(5, 5))
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        a, _ = self.attn(h, h, h, attn_mask=self.attn_bias, need_weights=False)
        return self.head(a.mean(1))


class Embed(nn.Module):
    def forward(self, tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, table)


class ArgumentTable(nn.Module):
    """A parameter passed as a forward argument to a module without parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(11, 6))
        self.embed = Embed()
        self.head = nn.Linear(6, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens, self.table)).mean(1))


class Borrow(nn.Module):
    """Uses a sibling's weight, held outside the module tree."""

    def __init__(self, source: nn.Linear) -> None:
        super().__init__()
        self._source = [source]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self._source[0].weight)


class Sibling(nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = Borrow(self.a)
        self.head = nn.Linear(6, CLASSES)
        self.tied = tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.b(x))
        if self.tied:
            h = torch.tanh(self.a(h))
        return self.head(h)


class Query(nn.Module):
    """A Linear whose input is a parameter (no example dimension)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Parameter(torch.randn(1, 6))
        self.proj = nn.Linear(6, 6)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(x + self.proj(self.q)))


class Doubled(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def instance_forward() -> nn.Module:
    model = _mlp(nn.Linear(6, 8))
    lin = model[0]
    lin.forward = types.MethodType(lambda self, x: F.linear(x, self.weight, self.bias) * 2, lin)
    return model


def legacy_weight_norm() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return _mlp(torch.nn.utils.weight_norm(nn.Linear(6, 8)))


def pruned() -> nn.Module:
    model = _mlp(nn.Linear(6, 8))
    prune.l1_unstructured(model[0], "weight", amount=0.3)
    return model


class Recurrent(nn.Module):
    def __init__(self, rnn: nn.RNNBase, h0: bool = False) -> None:
        super().__init__()
        self.rnn = rnn
        out = rnn.hidden_size if not getattr(rnn, "proj_size", 0) else rnn.proj_size
        out *= 2 if rnn.bidirectional else 1
        self.h0 = (
            nn.Parameter(0.1 * torch.randn(rnn.num_layers, 1, rnn.hidden_size)) if h0 else None
        )
        self.head = nn.Linear(out, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]  # examples first; a time-major layer gets [T, N, F]
        x = x if self.rnn.batch_first else x.transpose(0, 1)
        hx = None if self.h0 is None else self.h0.expand(-1, n, -1).contiguous()
        o, _ = self.rnn(x, hx)
        last = o[:, -1] if self.rnn.batch_first else o[-1]
        return self.head(last)


def _seq(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(n, 4, 3, generator=g)


class CrossThenSelf(nn.Module):
    """One ``nn.MultiheadAttention`` called twice: cross-attention (queries from the
    embedding, keys and values from a projection: three q/k/v blocks) and then
    self-attention (one input: the q/k/v rows one block); the calls' blocks differ."""

    def __init__(self, twice: bool) -> None:
        super().__init__()
        self.twice = twice
        self.embed = nn.Embedding(11, 8)
        self.proj = nn.Linear(8, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        m = torch.tanh(self.proj(h))
        h = h + self.attn(h, m, m, need_weights=False)[0]
        if self.twice:
            h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.head(h.mean(1))


class RootAdds(nn.Module):
    """Root parameters added to batched activations with every broadcast (the closed form of
    a root ``x + p``: positions ``[T, E]``, a feature row ``[E]`` on the left, ``[1, T, 1]``)
    and one add outside it (``alpha=2``: the generic path)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 3)
        self.pos = nn.Parameter(torch.randn(4, 3) * 0.3)
        self.col = nn.Parameter(torch.randn(3) * 0.3)
        self.row = nn.Parameter(torch.randn(1, 4, 1) * 0.3)
        self.scaled = nn.Parameter(torch.randn(4, 1) * 0.3)
        self.head = nn.Linear(3, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos
        h = self.col + torch.tanh(h)
        h = torch.add(torch.tanh(h), self.row)
        h = torch.add(h, self.scaled, alpha=2.0)
        return self.head(torch.tanh(h).mean(1))


def _tokens(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 11, (n, 4), generator=g)


def _vec(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(n, 6, generator=g)


def _img(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=g)


class Tokens(nn.Module):
    """A stock Embedding (closed-form path) with a padding row, tokens repeated per example."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6, padding_idx=0)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)).mean(1))


def shared_and_sibling() -> nn.Module:
    """A Linear registered twice (called twice) whose weight a sibling also reads (found by
    the generated-model property: a module under two names was restored wrongly)."""
    lin = nn.Linear(6, 6)
    return nn.Sequential(lin, nn.Tanh(), lin, Borrow(lin), nn.Linear(6, CLASSES))


def _frozen_gru() -> nn.Module:
    model = Recurrent(nn.GRU(3, 5, num_layers=2, batch_first=True))
    model.rnn.weight_hh_l1.requires_grad_(False)
    return model


CASES: list[dict] = [
    {
        "id": "shared_module_and_sibling",
        "build": shared_and_sibling,
        "x": _vec,
        "path": {"<model>": "generic", "0": "shares one of its parameters"},
    },
    {
        "id": "embedding_padding_idx",
        "build": Tokens,
        "x": lambda n, g: torch.randint(0, 4, (n, 6), generator=g),
        "path": {"embed": "fast embedding"},
    },
    {"id": "hooked_linear", "build": hooked_linear, "x": _vec, "path": {"0": "forward hook"}},
    {
        "id": "pre_hooked_linear",
        "build": pre_hooked_linear,
        "x": _vec,
        "path": {"0": "forward pre-hook"},
    },
    {
        "id": "hooked_conv_bn",
        "build": hooked_conv_bn,
        "x": _img,
        "path": {"conv": "forward hook", "norm": "forward hook"},
    },
    {"id": "hooked_layernorm", "build": hooked_layernorm, "x": _vec, "path": {"1": "forward hook"}},
    {
        "id": "root_bias_into_attn",
        "build": RootBias,
        "x": lambda n, g: torch.randn(n, 5, 4, generator=g),
        "path": {"attn": "generic"},
    },
    {
        "id": "cross_attention",
        "build": lambda: CrossThenSelf(False),
        "x": _tokens,
        "path": {"attn": "fast attention"},
    },
    {
        "id": "cross_then_self_attention",
        "build": lambda: CrossThenSelf(True),
        "x": _tokens,
        "path": {"attn": "fast attention"},
    },
    {"id": "root_adds", "build": RootAdds, "x": _tokens, "path": {"<model>": "root operations"}},
    {"id": "argument_table", "build": ArgumentTable, "x": _tokens, "path": {"embed": "generic"}},
    {"id": "sibling_weight", "build": lambda: Sibling(False), "x": _vec, "path": {"b": "generic"}},
    {
        "id": "tied_sibling",
        "build": lambda: Sibling(True),
        "x": _vec,
        "path": {"<model>": "generic"},
    },
    {"id": "linear_on_a_parameter", "build": Query, "x": _vec, "path": {"<model>": "generic"}},
    {
        "id": "overridden_forward",
        "build": lambda: _mlp(Doubled(6, 8)),
        "x": _vec,
        "path": {"0": "forward overridden by Doubled"},
    },
    {
        "id": "instance_forward",
        "build": instance_forward,
        "x": _vec,
        "path": {"0": "instance-level forward"},
    },
    {
        "id": "weight_norm",
        "build": lambda: _mlp(parametrizations.weight_norm(nn.Linear(6, 8))),
        "x": _vec,
        "path": {"0": "parametrization"},
    },
    {
        "id": "spectral_norm",
        "build": lambda: _mlp(parametrizations.spectral_norm(nn.Linear(6, 8))),
        "x": _vec,
        "path": {"0": "parametrization"},
    },
    {
        "id": "orthogonal",
        "build": lambda: _mlp(parametrizations.orthogonal(nn.Linear(6, 6)), 6),
        "x": _vec,
        "path": {"0": "parametrization"},
    },
    {
        "id": "legacy_weight_norm",
        "build": legacy_weight_norm,
        "x": _vec,
        "path": {"0": "forward pre-hook"},
    },
    {"id": "pruned", "build": pruned, "x": _vec, "path": {"0": "forward pre-hook"}},
    {
        "id": "gru",
        "build": lambda: Recurrent(nn.GRU(3, 5, num_layers=2, batch_first=True)),
        "x": _seq,
        "path": {"rnn": "recurrent"},
    },
    {"id": "gru_frozen_weight", "build": _frozen_gru, "x": _seq, "path": {"rnn": "recurrent"}},
    {
        "id": "lstm_bidirectional_time_major_proj",
        "build": lambda: Recurrent(nn.LSTM(3, 5, bidirectional=True, proj_size=2)),
        "x": _seq,
        "path": {"rnn": "recurrent"},
    },
    {
        "id": "rnn_relu_with_h0",
        "build": lambda: Recurrent(nn.RNN(3, 5, nonlinearity="relu", batch_first=True), h0=True),
        "x": _seq,
        "path": {"rnn": "recurrent"},
    },
]
IDS = [c["id"] for c in CASES]


def make(case: dict, n: int = 5, dtype=torch.float64, seed: int = 0):
    """``(model in eval mode, x, y)``; BatchNorm gets non-trivial running statistics."""
    torch.manual_seed(seed)
    model = case["build"]().to(dtype).eval()
    g = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(0.3 * torch.randn(m.running_mean.shape, generator=g))
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    x = case["x"](n, g)
    x = x.to(dtype) if x.is_floating_point() else x
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return model, x, y


def loop_grads(model: nn.Module, x, y) -> dict[str, torch.Tensor]:
    """``{name: [N, *shape]}``: example ``i``'s gradient of its CE, one forward each."""
    named = {k: p for k, p in model.named_parameters() if p.requires_grad}
    rows = []
    for i in range(len(y)):
        loss = F.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum")
        grads = torch.autograd.grad(loss, list(named.values()), allow_unused=True)
        rows.append(
            [
                torch.zeros_like(p) if g is None else g
                for p, g in zip(named.values(), grads, strict=True)
            ]
        )
    return {k: torch.stack([r[j] for r in rows]) for j, k in enumerate(named)}


def loop_diagonals(model: nn.Module, x, y) -> dict[str, dict[str, torch.Tensor]]:
    """The three curvature diagonals by definition, from every example's full Jacobian
    (frozen parameters included: curvature is defined for them too)."""
    named = dict(model.named_parameters())
    flags = {n: p.requires_grad for n, p in named.items()}
    for p in named.values():
        p.requires_grad_(True)
    try:
        return _loop_diagonals(model, x, y, named)
    finally:
        for n, p in named.items():
            p.requires_grad_(flags[n])


def _loop_diagonals(model, x, y, named):
    out = {
        k: {n: torch.zeros_like(p) for n, p in named.items()}
        for k in ("ggn", "empirical_fisher", "jacobian_gram")
    }
    for i in range(len(y)):
        z = model(x[i : i + 1])[0]
        jac = []
        for c in range(z.shape[0]):
            g = torch.autograd.grad(
                z[c], list(named.values()), retain_graph=True, allow_unused=True
            )
            jac.append(
                [
                    torch.zeros_like(p) if t is None else t
                    for p, t in zip(named.values(), g, strict=True)
                ]
            )
        p = torch.softmax(z.detach(), 0)
        h = torch.diag(p) - torch.outer(p, p)
        r = p - F.one_hot(y[i], z.shape[0]).to(p.dtype)
        for j, name in enumerate(named):
            jj = torch.stack([row[j] for row in jac]).reshape(z.shape[0], -1)  # [C, P]
            shape = named[name].shape
            out["ggn"][name] += torch.einsum("ap,ab,bp->p", jj, h, jj).reshape(shape) / len(y)
            out["empirical_fisher"][name] += (r @ jj).square().reshape(shape) / len(y)
            out["jacobian_gram"][name] += jj.square().sum(0).reshape(shape) / len(y)
    return out


def state(model: nn.Module) -> dict:
    """Everything an instrument must leave bitwise as found."""
    from torch._C._functorch import is_gradtrackingtensor

    return {
        "params": [
            (n, id(p), p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()
        ],
        "buffers": [(n, id(b), b.clone()) for n, b in model.named_buffers()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "flags": [m.training for m in model.modules()],
        "hooks": [
            (tuple(m._forward_hooks), tuple(m._forward_pre_hooks), tuple(m._backward_hooks))
            for m in model.modules()
        ],
        "attrs": [
            (k, id(v), is_gradtrackingtensor(v))
            for m in model.modules()
            for k, v in vars(m).items()
            if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter)
        ],
        "rng": torch.get_rng_state(),
    }


def differences(a: dict, b: dict) -> list[str]:
    bad = []
    for key in ("flags", "hooks", "attrs"):
        if a[key] != b[key]:
            bad.append(key)
    for (n, i, v, r), (n2, i2, v2, r2) in zip(a["params"], b["params"], strict=True):
        if n != n2 or i != i2 or r != r2 or not torch.equal(v, v2):
            bad.append(f"param {n}")
    for (n, i, v), (n2, i2, v2) in zip(a["buffers"], b["buffers"], strict=True):
        if n != n2 or i != i2 or not torch.equal(v, v2):
            bad.append(f"buffer {n}")
    for g, g2 in zip(a["grads"], b["grads"], strict=True):
        if (g is None) != (g2 is None) or (g is not None and not torch.equal(g, g2)):
            bad.append("grad")
    if not torch.equal(a["rng"], b["rng"]):
        bad.append("rng")
    return bad
