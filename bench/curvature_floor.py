"""Models and pullback floors for ``bench/bench_curvature.py``.

The **pullback floor** is the work every exact pullback method of a curvature diagonal does
at least, with the per-example split and the diagonal accumulation free: one forward, the
``C`` unit logit directions pulled back through the network, and each parameter's gradient
of each direction **summed over the examples** (same multiply-adds as the per-example
gradients, in the most favourable layout). Measured three ways in the same run; the floor is
the fastest:

* ``autograd, one batched pass``: ``autograd.grad(logits, params, E, is_grads_batched=True)``;
* ``autograd, C passes``: ``C`` reverse passes of one graph, ``autograd.grad(logits, params, e_c)``;
* ``layer outputs + summed GEMMs`` (models whose parameters all sit in Conv2d / BatchNorm2d /
  Linear layers): ``C`` reverse passes to the layers' *outputs* only (input gradients, no
  autograd weight gradients), then per direction one GEMM per layer on patches unfolded once,
  ``dW_c = Delta_c [C_out, N*T] @ U [N*T, C_in*kh*kw]``, and ``sum (delta_c * x_hat)`` /
  ``sum delta_c`` for BatchNorm. The float64 CPU convolution weight gradient of autograd
  (``_slow_conv2d_backward``) is slower than this GEMM, so without this variant a method that
  uses GEMMs could beat the "floor" by kernel choice alone.

Not a floor but reported beside it: ``bound: layer outputs only``, the ``C`` reverse passes to
the layer outputs with no parameter gradient at all. Every pullback method needs at least
this; it is the lower bound where the per-example gradients need not be formed (a Linear
layer with one row per example: ``diag_W = sum_i (sum_k u_iko^2) a_ij^2`` is one GEMM for all
directions together, less work than the floor's ``C`` weight gradients, so there the floor is
*not* a lower bound).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DT = torch.float64


class ResidualBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.act1, self.act2 = nn.ReLU(), nn.ReLU()  # modules, so BackPACK's converter can see them

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act1(self.bn1(self.conv1(x)))
        return self.act2(x + self.bn2(self.conv2(h)))


class ResidualCNN(nn.Module):
    """1 x side x side -> 16 ch -> 2 blocks -> 32 ch (stride 2) -> 1 block -> 2x2 max pool -> 10.

    (Max, not average, pooling: BackPACK 1.7's average-pool derivative builds a float32
    transposed convolution and fails in float64.)"""

    def __init__(self, width: int = 16, side: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.stage1 = nn.Sequential(ResidualBlock(width), ResidualBlock(width))
        self.down = nn.Sequential(
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
        )
        self.stage2 = ResidualBlock(2 * width)
        self.pool = nn.MaxPool2d(2)
        self.flat = nn.Flatten()
        self.head = nn.Linear(2 * width * (side // 4) ** 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(self.flat(self.pool(h)))


class TransformerBlock(nn.Module):
    """Tokens -> Embedding + learned positions -> pre-LN attention and MLP -> mean pool -> 10."""

    def __init__(self, vocab: int = 100, length: int = 16, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(length, dim) * 0.1)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.mlp(self.ln2(h))
        return self.head(h.mean(1))


def randomize_bn(model: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model


def _units(logits: torch.Tensor) -> torch.Tensor:
    c = logits.shape[1]
    return torch.eye(c, dtype=logits.dtype)[:, None, :].expand(c, logits.shape[0], c)


def autograd_floor(model: nn.Module, x: torch.Tensor, batched: bool) -> list[torch.Tensor]:
    """Forward + ``C`` VJPs of the logits to every parameter, summed over the examples;
    returns the last direction's gradients (``[C, ...]`` each when batched)."""
    params = list(model.parameters())
    logits = model(x)
    eye = _units(logits)
    if batched:
        return list(torch.autograd.grad(logits, params, eye, is_grads_batched=True))
    for c in range(eye.shape[0]):
        grads = torch.autograd.grad(logits, params, eye[c], retain_graph=c < eye.shape[0] - 1)
    return list(grads)


_LAYERS = (nn.Conv2d, nn.BatchNorm2d, nn.Linear)


def layer_gemm_supported(model: nn.Module) -> bool:
    """Every parameter sits directly in a Conv2d (groups 1) / BatchNorm2d / Linear layer."""
    covered = {
        id(p)
        for m in model.modules()
        if isinstance(m, _LAYERS) and getattr(m, "groups", 1) == 1
        for p in m.parameters(recurse=False)
    }
    return all(id(p) in covered for p in model.parameters())


def _prepare(m: nn.Module, a: torch.Tensor) -> torch.Tensor:
    """What each layer's summed gradient contracts the cotangent with (computed once)."""
    if isinstance(m, nn.Conv2d):
        u = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)
        return u.transpose(1, 2).reshape(-1, u.shape[1])  # [N*T, C_in*kh*kw]
    if isinstance(m, nn.BatchNorm2d):
        shape = (1, -1, 1, 1)
        return (a - m.running_mean.view(shape)) * torch.rsqrt(m.running_var.view(shape) + m.eps)
    return a


def _summed_grads(m: nn.Module, prep: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    """``[dW, (db)]`` of one layer and direction, summed over the examples (and positions)."""
    if isinstance(m, nn.Conv2d):
        rows = g.transpose(0, 1).reshape(g.shape[1], -1)  # [C_out, N*T]
        w, b = (rows @ prep).view_as(m.weight), rows.sum(1)
    elif isinstance(m, nn.BatchNorm2d):
        w, b = (g * prep).sum((0, 2, 3)), g.sum((0, 2, 3))
    else:
        w, b = g.T @ prep, g.sum(0)
    return [w, b] if m.bias is not None else [w]


def layer_gemm_floor(
    model: nn.Module, x: torch.Tensor, contract: bool = True
) -> dict[int, torch.Tensor]:
    """Forward; ``C`` reverse passes to every Conv2d / BatchNorm2d / Linear output; then per
    direction and layer the batch-summed parameter gradient by one GEMM (module docstring).
    Returns the last direction's gradients, keyed by ``id(parameter)``."""
    record: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []
    handles = [
        m.register_forward_hook(lambda m, i, o: record.append((m, i[0].detach(), o)))
        for m in model.modules()
        if isinstance(m, _LAYERS)
    ]
    try:
        logits = model(x)
    finally:
        for h in handles:
            h.remove()
    prep = [_prepare(m, a) for m, a, _ in record] if contract else []
    outs = [o for _, _, o in record]
    eye = _units(logits)
    last: dict[int, torch.Tensor] = {}
    for c in range(eye.shape[0]):
        grads = torch.autograd.grad(logits, outs, eye[c], retain_graph=c < eye.shape[0] - 1)
        if not contract:
            continue
        last = {}  # this direction's gradients
        for (m, _, _), p, g in zip(record, prep, grads, strict=True):
            for param, t in zip(m.parameters(recurse=False), _summed_grads(m, p, g), strict=True):
                last[id(param)] = last.get(id(param), 0) + t  # a layer called twice adds up
    return last


def floors(model: nn.Module, x: torch.Tensor) -> dict:
    """``{label: callable}`` of every floor variant this model supports."""
    out = {
        "floor: autograd, one batched pass": lambda: autograd_floor(model, x, True),
        "floor: autograd, C passes": lambda: autograd_floor(model, x, False),
    }
    if layer_gemm_supported(model):
        out["floor: layer outputs + summed GEMMs"] = lambda: layer_gemm_floor(model, x)
        out["bound: layer outputs only"] = lambda: layer_gemm_floor(model, x, contract=False)
    return out
