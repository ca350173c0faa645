"""A grammar of small random models for the seam's generated-model property.

A model is described by a *spec*, plain data (dicts, lists, numbers, strings), so that every
counter-example hypothesis finds can be pinned as a literal ``@example``; :func:`build` turns
a spec into ``(model, x, y)`` deterministically. Every block maps tokens ``[N, T, D]`` to
``[N, T', D']``; the head averages the tokens and applies a Linear to ``C`` classes.

Blocks: Linear (over ``[N, T, D]`` and with an extra leading dim), Conv1d over the tokens
(stride, dilation, groups, integer or ``"same"`` padding, every padding mode), Conv2d over
``[N, 1, T, D]``, BatchNorm1d in eval (random running statistics), LayerNorm / GroupNorm with
and without affine, Embedding (token inputs; ``padding_idx``, ``max_norm``),
MultiheadAttention, TransformerEncoderLayer, RNN / GRU / LSTM, nested ``SkippableResidual``
with and without a projection bypass (a mask or an outside gain left on it), tied parameters
(a shared module; a module using a sibling's weight), a root parameter passed into a block as
a forward argument and one used in the root ``forward``. Modifiers on a parametrized block:
frozen, a forward hook that scales or shifts its output, a forward pre-hook, a
parametrization (``weight_norm`` or a custom one), activation checkpointing.

Edge operations: ``torch.cdist`` to a parameter (torch's batched pullback of its backward is
wrong), ``nn.PReLU`` (one or per-channel slopes; its backward has no batching rule), a
module updating a buffer in place at every forward (a call counter), a BatchNorm frozen in
``eval()`` inside the model in ``train()`` (re-frozen after every ``model.train()`` by
:func:`refreeze`), and examples mixed across the batch (``cumsum`` over the examples, causal,
or ``roll``): to be refused by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import parametrize
from torch.utils.checkpoint import checkpoint

from fathom.depth import SkippableResidual

MODES = ("zeros", "reflect", "replicate", "circular")


# -- modules ------------------------------------------------------------------------------
class Conv1dTokens(nn.Module):
    """Conv1d over the token axis: ``[N, T, D] -> [N, D, T] -> conv -> [N, T', D']``."""

    def __init__(self, m: nn.Conv1d) -> None:
        super().__init__()
        self.m = m

    def forward(self, h):
        return self.m(h.transpose(1, 2)).transpose(1, 2)


class Conv2dTokens(nn.Module):
    """Conv2d over ``[N, 1, T, D]``; the ``c`` output maps of width ``D'`` become features."""

    def __init__(self, m: nn.Conv2d) -> None:
        super().__init__()
        self.m = m

    def forward(self, h):
        z = self.m(h.unsqueeze(1))  # [N, c, T', D']
        return z.permute(0, 2, 1, 3).flatten(2)


class Channels(nn.Module):
    """A norm over channels (BatchNorm1d, GroupNorm) applied to ``[N, D, T]``."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, h):
        return self.m(h.transpose(1, 2)).transpose(1, 2)


class LeadLinear(nn.Module):
    """A Linear over ``[N, T, 1, D]`` (three leading dims)."""

    def __init__(self, m: nn.Linear) -> None:
        super().__init__()
        self.m = m

    def forward(self, h):
        return self.m(h.unsqueeze(2)).squeeze(2)


class SelfAttention(nn.Module):
    def __init__(self, m: nn.MultiheadAttention, need_weights: bool) -> None:
        super().__init__()
        self.m, self.need_weights = m, need_weights

    def forward(self, h):
        q = h if self.m.batch_first else h.transpose(0, 1)
        out = self.m(q, q, q, need_weights=self.need_weights)[0]
        return out if self.m.batch_first else out.transpose(0, 1)


class Encoder(nn.Module):
    def __init__(self, m: nn.TransformerEncoderLayer, batch_first: bool) -> None:
        super().__init__()
        self.m, self.batch_first = m, batch_first

    def forward(self, h):
        return self.m(h) if self.batch_first else self.m(h.transpose(0, 1)).transpose(0, 1)


class Recurrent(nn.Module):
    def __init__(self, m: nn.RNNBase) -> None:
        super().__init__()
        self.m = m

    def forward(self, h):
        return self.m(h)[0]


class SiblingWeight(nn.Module):
    """``F.linear(h, source.weight)``: uses a sibling's weight without owning it."""

    def __init__(self, source: nn.Linear) -> None:
        super().__init__()
        object.__setattr__(self, "source", source)  # not registered: a foreign parameter

    def forward(self, h):
        return F.linear(h, self.source.weight)


class ArgShift(nn.Module):
    """``h + shift`` with ``shift`` a root parameter passed in as a forward argument."""

    def forward(self, h, shift):
        return h + shift


class Checkpointed(nn.Module):
    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, h):
        return checkpoint(self.m, h, use_reentrant=False)


class Prototypes(nn.Module):
    """``-cdist(h, W)``: distances of each token to ``K`` learned prototypes ``W [K, D]``."""

    def __init__(self, d: int, k: int, p: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, d))
        self.p = p

    def forward(self, h):
        return -torch.cdist(h, self.weight, p=self.p)


class Counter(nn.Module):
    """The identity, counting its calls in a buffer updated in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, h):
        self.calls += 1
        return h


class BatchMix(nn.Module):
    """Mixes examples across the batch: a ``cumsum`` over them (causal) or a ``roll``."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def forward(self, h):
        return h.cumsum(0) if self.how == "cumsum" else h + 0.5 * h.roll(1, 0)


def refreeze(model: nn.Module) -> nn.Module:
    """Put every module marked ``eval_frozen`` back in ``eval()`` (after ``model.train()``)."""
    for m in model.modules():
        if getattr(m, "eval_frozen", False):
            m.eval()
    return model


class Doubled(nn.Module):
    """A custom parametrization ``W -> 1.5 W + 0.1``."""

    def forward(self, w):
        return 1.5 * w + 0.1


class Net(nn.Module):
    """Input stage, the blocks, token mean, an optional root scale, Linear head.

    ``head``: ``"mean"`` (the tokens averaged: ``[N, C]``), ``"tokens"`` (the head on every
    token: ``[N, T, C]``) or ``"channels"`` (the same, classes at dim 1: ``[N, C, T]``)."""

    def __init__(
        self,
        stem: nn.Module,
        blocks: list[nn.Module],
        shifts: int,
        d: int,
        c: int,
        scale: bool,
        head: str = "mean",
    ):
        super().__init__()
        self.head_kind = head
        self.stem = stem
        self.blocks = nn.ModuleList(blocks)
        self.shifts = nn.ParameterList([nn.Parameter(torch.randn(1) * 0.3) for _ in range(shifts)])
        self.scale = nn.Parameter(1.0 + 0.3 * torch.randn(d)) if scale else None
        self.head = nn.Linear(d, c)

    def forward(self, x):
        h, j = self.stem(x), 0
        for block in self.blocks:
            if isinstance(block, ArgShift):
                h, j = block(h, self.shifts[j]), j + 1
            else:
                h = block(h)
        if self.head_kind == "mean":
            h = h.mean(dim=1)
        z = self.head(h if self.scale is None else h * self.scale)
        return z.transpose(1, 2) if self.head_kind == "channels" else z


class Seq(nn.Module):
    """A branch: the blocks in order (ArgShift not allowed inside)."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, h):
        for block in self.blocks:
            h = block(h)
        return h


# -- specs --------------------------------------------------------------------------------
def _conv_len(t: int, k: int, stride: int, dil: int, pad: int) -> int:
    return (t + 2 * pad - dil * (k - 1) - 1) // stride + 1


@st.composite
def modifiers(draw, weight: bool) -> dict:
    return {
        "frozen": draw(st.sampled_from([None, "all", "first"])),
        "hook": draw(st.sampled_from([None, "scale", "shift", "pre"])),
        "param": draw(st.sampled_from([None, "weight_norm", "custom"])) if weight else None,
        "ckpt": draw(st.booleans()),
    }


@st.composite
def block(draw, d: int, t: int, depth: int, squares: tuple[tuple[int, int, str | None], ...]):
    """One block spec for input ``[N, t, d]`` and its output ``(d', t')``.

    ``squares``: ``(index, width, tie)`` of the top-level square Linears a later block may tie
    to (only at depth 0; ``tie`` the kind of tie already made to it, if any); inside a
    residual branch (depth > 0) the token count is kept.

    A Linear may be both shared (called twice) and used by a sibling's ``F.linear``: the
    counter-example hypothesis found for it is the named test
    ``test_shared_module_whose_weight_a_sibling_uses`` in test_seam_generated.py.
    """
    kinds = ["linear", "act", "bn", "ln", "gn", "mha", "encoder", "rnn"]
    kinds += ["cdist", "prelu", "counter", "mix"]
    kinds = [k for k in kinds if k != "gn" or d * t > 1]
    kinds += ["conv1d", "conv2d", "argshift"] if depth == 0 else []
    kinds += ["res"] if depth < 2 else []
    ties = {tie: [i for i, width, _made in squares if width == d] for tie in ("shared", "sibling")}
    kinds += [tie for tie, sources in ties.items() if sources and depth == 0]
    kind = draw(st.sampled_from(kinds))
    w = st.integers(1, 5)
    spec: dict = {"kind": kind}
    if kind == "linear":
        spec |= {"out": draw(w), "bias": draw(st.booleans()), "lead": draw(st.booleans())}
        d = spec["out"]
    elif kind == "act":
        spec["fn"] = draw(st.sampled_from(["tanh", "relu", "gelu"]))
    elif kind in ("shared", "sibling"):
        spec["source"] = draw(st.sampled_from(ties[kind]))
    elif kind == "conv1d":
        spec, d, t = _conv1d(draw, d, t)
    elif kind == "conv2d":
        c, kh, kw = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
        kh, kw = min(kh, t), min(kw, d)
        stride, pad = draw(st.integers(1, 2)), draw(st.sampled_from([0, 1]))
        mode = draw(st.sampled_from(MODES)) if pad < min(t, d) else "zeros"
        t2, d2 = _conv_len(t, kh, stride, 1, pad), _conv_len(d, kw, stride, 1, pad)
        spec |= {"out": c, "k": [kh, kw], "stride": stride, "pad": pad, "mode": mode}
        d, t = c * d2, t2
    elif kind == "bn":
        spec["affine"] = draw(st.booleans())
        spec["eval_frozen"] = draw(st.booleans())
    elif kind == "cdist":
        spec |= {"out": draw(w), "p": draw(st.sampled_from([2.0, 1.0]))}
        d = spec["out"]
    elif kind == "prelu":
        spec["channels"] = draw(st.sampled_from([1, d]))
    elif kind == "mix":
        spec["how"] = draw(st.sampled_from(["cumsum", "roll"]))
    elif kind == "ln":
        spec |= {"affine": draw(st.booleans()), "bias": draw(st.booleans())}
    elif kind == "gn":  # more than one value per group (torch refuses one, even in eval)
        groups = draw(st.sampled_from([x for x in (1, 2) if d % x == 0 and d // x * t > 1]))
        spec |= {"groups": groups, "affine": draw(st.booleans())}
    elif kind in ("mha", "encoder"):
        spec |= {"heads": draw(st.sampled_from([x for x in (1, 2) if d % x == 0]))}
        spec |= {"batch_first": draw(st.booleans())}
        if kind == "mha":
            spec |= {"need_weights": draw(st.booleans()), "bias": draw(st.booleans())}
            spec |= {"bias_kv": draw(st.booleans())}
        else:
            spec |= {"ff": draw(w), "norm_first": draw(st.booleans())}
            spec |= {"fn": draw(st.sampled_from(["relu", "gelu"]))}
    elif kind == "rnn":
        spec |= {"cell": draw(st.sampled_from(["rnn", "gru", "lstm"])), "hidden": draw(w)}
        spec |= {"layers": draw(st.integers(1, 2)), "bidir": draw(st.booleans())}
        d = spec["hidden"] * (2 if spec["bidir"] else 1)
    elif kind == "res":
        inner, d_b = [], d
        for _ in range(draw(st.integers(1, 2))):
            b, d_b, _ = draw(block(d_b, t, depth + 1, ()))
            inner.append(b)
        proj = d_b != d or draw(st.booleans())
        spec |= {"branch": inner, "proj": proj, "p": draw(st.sampled_from([0.0, 0.3]))}
        spec |= {"left": draw(st.sampled_from([None, "mask0", "mask1", "gain"]))}
        d = d_b
    if kind in (
        "linear",
        "conv1d",
        "conv2d",
        "mha",
        "encoder",
        "rnn",
        "cdist",
        "prelu",
    ) or spec.get("affine"):
        spec["mod"] = draw(modifiers(kind in ("linear", "conv1d", "conv2d")))
    return spec, d, t


def _conv1d(draw, d: int, t: int) -> tuple[dict, int, int]:
    groups = draw(st.sampled_from([x for x in (1, 2, 3) if d % x == 0]))
    out = groups * draw(st.integers(1, 2))
    k, stride, dil = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = ["same", 0, 1] if stride == 1 else [0, 1]
    pad = draw(st.sampled_from(pads))
    mode = draw(st.sampled_from(MODES))
    if _conv_len(t, k, stride, dil, 0 if pad == "same" else pad) < 1 and pad != "same":
        k, dil = 1, 1
    reach = dil * (k - 1) if pad == "same" else pad  # reflect/circular pad one side < t
    if mode != "zeros" and reach >= t:
        mode = "zeros"
    new_t = t if pad == "same" else _conv_len(t, k, stride, dil, pad)
    spec = {"kind": "conv1d", "out": out, "k": k, "stride": stride, "dil": dil}
    spec |= {"groups": groups, "pad": pad, "mode": mode}
    return spec, out, new_t


@st.composite
def specs(draw) -> dict:
    """A whole model: dtype, probe size, classes, input, blocks (see the module docstring)."""
    tokens = draw(st.booleans())
    t, d = draw(st.integers(2, 4)), draw(st.integers(1, 4))
    spec = {
        "dtype": draw(st.sampled_from(["float64", "float32"])),
        "n": draw(st.integers(1, 4)),
        "classes": draw(st.integers(2, 4)),
        "t": t,
        "d": d,
        "input": "tokens" if tokens else "float",
        "features": draw(st.integers(1, 3)),
        "padding_idx": draw(st.sampled_from([None, 0])),
        "max_norm": draw(st.sampled_from([False, False, False, True])) if tokens else False,
        "root_scale": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
        "blocks": [],
    }
    squares: list[tuple[int, int, str | None]] = []
    for i in range(draw(st.integers(1, 3))):
        b, d_new, t = draw(block(d, t, 0, tuple(squares)))
        if b["kind"] == "linear" and d_new == d and not b["lead"]:
            squares.append((i, d, None))
        if b["kind"] in ("shared", "sibling"):
            squares = [(j, w, b["kind"] if j == b["source"] else made) for j, w, made in squares]
        spec["blocks"].append(b)
        d = d_new
    spec["d_out"] = d
    return spec


# -- building -----------------------------------------------------------------------------
def _hook(kind: str):
    def scale(module, args, out):
        return (out[0] * 1.5, *out[1:]) if isinstance(out, tuple) else out * 1.5

    def shift(module, args, out):
        return (out[0] + 0.25, *out[1:]) if isinstance(out, tuple) else out + 0.25

    def pre(module, args):
        return (args[0] * 0.5, *args[1:])

    return {"scale": scale, "shift": shift, "pre": pre}[kind]


def _modify(m: nn.Module, wrapper: nn.Module, mod: dict | None) -> nn.Module:
    """Apply the modifiers to the torch module ``m`` inside its block ``wrapper``."""
    if not mod:
        return wrapper
    if mod["param"] == "weight_norm":
        torch.nn.utils.parametrizations.weight_norm(m)
    elif mod["param"] == "custom":
        parametrize.register_parametrization(m, "weight", Doubled())
    if mod["hook"] == "pre":
        m.register_forward_pre_hook(_hook("pre"))
    elif mod["hook"]:
        m.register_forward_hook(_hook(mod["hook"]))
    params = list(m.parameters())
    for p in params if mod["frozen"] == "all" else params[:1] if mod["frozen"] else []:
        p.requires_grad_(False)
    return Checkpointed(wrapper) if mod["ckpt"] else wrapper


def _block(spec: dict, d: int, t: int, built: list[nn.Module]) -> tuple[nn.Module, int, int]:
    kind, mod = spec["kind"], spec.get("mod")
    if kind == "linear":
        m = nn.Linear(d, spec["out"], bias=spec["bias"])
        return _modify(m, LeadLinear(m) if spec["lead"] else m, mod), spec["out"], t
    if kind == "act":
        return {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}[spec["fn"]](), d, t
    if kind == "shared":
        return built[spec["source"]], d, t
    if kind == "sibling":
        source = built[spec["source"]]
        return SiblingWeight(source.m if isinstance(source, Checkpointed) else source), d, t
    if kind == "argshift":
        return ArgShift(), d, t
    if kind == "conv1d":
        pad = spec["pad"]
        m = nn.Conv1d(
            d,
            spec["out"],
            spec["k"],
            spec["stride"],
            pad,
            spec["dil"],
            spec["groups"],
            padding_mode=spec["mode"],
        )
        t = t if pad == "same" else _conv_len(t, spec["k"], spec["stride"], spec["dil"], pad)
        return _modify(m, Conv1dTokens(m), mod), spec["out"], t
    if kind == "conv2d":
        (kh, kw), s, pad = spec["k"], spec["stride"], spec["pad"]
        m = nn.Conv2d(1, spec["out"], (kh, kw), s, pad, padding_mode=spec["mode"])
        t2, d2 = _conv_len(t, kh, s, 1, pad), _conv_len(d, kw, s, 1, pad)
        return _modify(m, Conv2dTokens(m), mod), spec["out"] * d2, t2
    if kind == "bn":
        m = nn.BatchNorm1d(d, affine=spec["affine"])
        m.running_mean.normal_(0.0, 0.5)
        m.running_var.uniform_(0.5, 2.0)
        if spec.get("eval_frozen"):  # a frozen BatchNorm: eval() in a model in train()
            m.eval_frozen = True
            for p in m.parameters():
                p.requires_grad_(False)
        return _modify(m, Channels(m), mod), d, t
    if kind == "cdist":
        m = Prototypes(d, spec["out"], spec["p"])
        return _modify(m, m, mod), spec["out"], t
    if kind == "prelu":
        m = nn.PReLU(spec["channels"], init=0.1)
        return _modify(m, Channels(m) if spec["channels"] > 1 else m, mod), d, t
    if kind == "counter":
        return Counter(), d, t
    if kind == "mix":
        return BatchMix(spec["how"]), d, t
    if kind == "ln":
        m = nn.LayerNorm(d, elementwise_affine=spec["affine"], bias=spec["bias"])
        return _modify(m, m, mod), d, t
    if kind == "gn":
        m = nn.GroupNorm(spec["groups"], d, affine=spec["affine"])
        return _modify(m, Channels(m), mod), d, t
    if kind == "mha":
        m = nn.MultiheadAttention(
            d,
            spec["heads"],
            bias=spec["bias"],
            add_bias_kv=spec["bias_kv"],
            batch_first=spec["batch_first"],
        )
        return _modify(m, SelfAttention(m, spec["need_weights"]), mod), d, t
    if kind == "encoder":
        m = nn.TransformerEncoderLayer(
            d,
            spec["heads"],
            spec["ff"],
            dropout=0.1,
            activation=spec["fn"],
            batch_first=spec["batch_first"],
            norm_first=spec["norm_first"],
        )
        return _modify(m, Encoder(m, spec["batch_first"]), mod), d, t
    if kind == "rnn":
        cls = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}[spec["cell"]]
        m = cls(
            d,
            spec["hidden"],
            num_layers=spec["layers"],
            bidirectional=spec["bidir"],
            batch_first=True,
        )
        return _modify(m, Recurrent(m), mod), spec["hidden"] * (2 if spec["bidir"] else 1), t
    assert kind == "res", kind
    inner, d_b = [], d
    for b in spec["branch"]:
        blk, d_b, _ = _block(b, d_b, t, [])
        inner.append(blk)
    bypass = nn.Linear(d, d_b, bias=False) if spec["proj"] else None
    res = SkippableResidual(Seq(inner), bypass, p=spec["p"], seed=0)
    if spec["left"] == "gain":
        res.gain = 0.0  # ignored in dense evaluation
    elif spec["left"]:
        res.mask = spec["left"] == "mask1"  # a mask left on the model; dense evaluation clears it
    return res, d_b, t


def build(spec: dict) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """``(model, x, y)`` of a spec, deterministic in ``spec["seed"]``; the model in ``train()``."""
    torch.manual_seed(spec["seed"])
    dtype = getattr(torch, spec["dtype"])
    n, t, d = spec["n"], spec["t"], spec["d"]
    if spec["input"] == "tokens":
        vocab = 5
        stem = nn.Embedding(
            vocab, d, padding_idx=spec["padding_idx"], max_norm=1.0 if spec["max_norm"] else None
        )
        x = torch.randint(0, vocab, (n, t))
    else:
        stem = nn.Linear(spec["features"], d)
        x = torch.randn(n, t, spec["features"], dtype=dtype)
    built: list[nn.Module] = []
    shifts = 0
    for b in spec["blocks"]:
        blk, d, t = _block(b, d, t, built)
        shifts += isinstance(blk, ArgShift)
        built.append(blk)
    head = spec.get("head", "mean")
    model = Net(stem, built, shifts, d, spec["classes"], spec["root_scale"], head).to(dtype)
    y = torch.randint(0, spec["classes"], (n,))
    return refreeze(model.train()), x, y
