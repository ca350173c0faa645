"""A model zoo as data: small models every instrument must handle exactly.

Each case is a dict (curvlinops ``cases.py`` style): ``id``, ``build`` (seeded, returns an
``nn.Module`` in float64 eval mode) and ``inputs`` (seeded ``(x, y)``). Shared by the seam,
telemetry and curvature tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fathom.depth import SkippableResidual
from fathom.models import StagedConvNet
from fathom.models.neurons import LIFConfig

CLASSES = 3
THRESHOLD = 0.2


class ResidualMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 8)
        self.blocks = nn.ModuleList(
            SkippableResidual(nn.Sequential(nn.Linear(8, 8), nn.Tanh())) for _ in range(2)
        )
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def bn_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.BatchNorm2d(3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, CLASSES),
    )


class ResidualCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.blocks = nn.Sequential(
            *(
                SkippableResidual(
                    nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4))
                )
                for _ in range(2)
            )
        )
        self.conv1d = nn.Conv1d(4, 2, 3, padding=1)
        self.head = nn.Linear(2 * 8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        h = torch.relu(self.blocks(h))
        h = torch.nn.functional.avg_pool2d(h, 2).flatten(2)  # [N, 4, 16]
        h = torch.nn.functional.avg_pool1d(self.conv1d(h), 2)  # [N, 2, 8]
        return self.head(h.flatten(1))


class TinyTransformer(nn.Module):
    """Embedding + LayerNorm + nn.MultiheadAttention + a position-wise Linear, mean-pooled."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(11, 8)
        self.ln = nn.LayerNorm(8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        self.mlp = nn.Linear(8, 8)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)  # [N, S, E]
        a = self.ln(h)
        if not self.batch_first:
            a = a.transpose(0, 1)
        att = self.attn(a, a, a, need_weights=False)[0]
        if not self.batch_first:
            att = att.transpose(0, 1)
        h = h + att
        h = h + torch.tanh(self.mlp(h))
        return self.head(h.mean(dim=1))


def staged_ann() -> nn.Module:
    return StagedConvNet(
        stages=2,
        widths=(3, 4),
        blocks_per_stage=2,
        classes=CLASSES,
        neuron="relu",
        timesteps=0,
        residual=True,
        in_channels=1,
        image_size=8,
    )


def staged_lif() -> nn.Module:
    """A low threshold, so that every layer spikes on the tiny random probe."""
    return StagedConvNet(
        lif=LIFConfig(v_threshold=THRESHOLD),
        stages=2,
        widths=(6, 8),
        blocks_per_stage=2,
        classes=CLASSES,
        neuron="lif",
        timesteps=2,
        residual=True,
        in_channels=1,
        image_size=8,
    )


def _images(n: int, g: torch.Generator, side: int = 8) -> torch.Tensor:
    return torch.randn(n, 1, side, side, generator=g, dtype=torch.float64)


def _tokens(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 11, (n, 5), generator=g)


def _mlp_inputs(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(n, 6, generator=g, dtype=torch.float64)


CASES: list[dict[str, Any]] = [
    {"id": "residual_mlp", "build": ResidualMLP, "x": _mlp_inputs},
    {"id": "bn_cnn", "build": bn_cnn, "x": _images},
    {"id": "residual_cnn", "build": ResidualCNN, "x": _images},
    {"id": "transformer", "build": TinyTransformer, "x": _tokens},
    {"id": "transformer_seq_first", "build": lambda: TinyTransformer(False), "x": _tokens},
    {"id": "staged_ann", "build": staged_ann, "x": _images},
    {"id": "staged_lif", "build": staged_lif, "x": lambda n, g: 3 * _images(n, g)},
]


def _randomize_buffers(model: nn.Module, g: torch.Generator) -> None:
    """Non-trivial BatchNorm running statistics, so eval mode is not the identity."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.3)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            with torch.no_grad():
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))


def make(
    case: dict[str, Any], n: int = 7, seed: int = 0
) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """``(model in float64 eval mode, x, y)`` for one zoo case."""
    torch.manual_seed(seed)
    model: nn.Module = case["build"]()
    g = torch.Generator().manual_seed(seed + 1)
    model = model.double().eval()
    _randomize_buffers(model, g)
    x = case["x"](n, g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return model, x, y


def brute_force_grads(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Full per-example gradients of the unaveraged cross entropy: ``vmap(grad)`` in float64."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        logits = torch.func.functional_call(model, p, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(logits, yi.unsqueeze(0), reduction="sum")

    return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)


IDS: list[str] = [c["id"] for c in CASES]
BUILDERS: dict[str, Callable[[], nn.Module]] = {c["id"]: c["build"] for c in CASES}
