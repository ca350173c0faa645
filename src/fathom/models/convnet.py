"""Staged conv nets, ANN or spiking: the depth-scaling benchmark's model.

``stages`` stages of ``blocks_per_stage`` blocks; depth = ``stages * blocks_per_stage`` conv
layers. Each block, and each stage closed by a 2×2 max pool::

    h = neuron(bn(conv3x3(h)))                      # plain block
    h = neuron(h + gain * bn(conv3x3(h)))           # residual block (equal in/out widths)
    h = maxpool2x2(h)                               # after the last block of every stage
    logits = mean_t linear(flatten(h_t))            # classifier on widths[-1] × 2 × 2 (32² input)

``conv3x3`` has no bias (BatchNorm supplies it); the no-BN control (``batchnorm=False``)
gives the conv a bias instead. Residual blocks are the blocks after the first in each stage
(the first changes the width, and no projection is added, so parameter counts are those of
the plain net); the branch is a :class:`fathom.depth.SkippableResidual`.

Spiking mode (``neuron="lif"``, ``timesteps=T >= 1``): direct encoding (the image is the
input current at every timestep), leaky integrate-and-fire neurons
(:mod:`fathom.models.neurons`), logits averaged over the T timesteps. Tensors between
blocks are time-folded batch-major, ``[B * T, C, H, W]``; conv, BatchNorm (statistics over
batch and time) and pooling act on every timestep alike. ``neuron="relu"`` or
``timesteps=0`` is the ANN.

For CIFAR-100 at full width the parameter counts are 1,756,836 / 4,892,196 / 8,027,556 /
11,162,916 / 14,298,276 at depths 4 / 8 / 12 / 16 / 20.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fathom.config.models import NEURONS, StagedConvConfig, check_image_size, check_timesteps
from fathom.depth import SkippableResidual
from fathom.errors import FathomError
from fathom.models.neurons import LIF, LIFConfig
from fathom.models.prep import ImageInput
from fathom.models.specs import (
    STAGED_CONV_WIDTHS,
    DataShape,
    blocks_per_stage_for_depth,
    scaled_widths,
)

FULL_WIDTHS = STAGED_CONV_WIDTHS  # defined without torch, beside the kind's widths


class ConvBlock(nn.Module):
    """``neuron(bn(conv(h)))``, or ``neuron(h + gain * bn(conv(h)))`` when residual, then pool."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        neuron: nn.Module,
        *,
        residual: bool,
        batchnorm: bool,
        pool: bool,
    ) -> None:
        super().__init__()
        if residual and c_in != c_out:
            raise FathomError(f"a residual conv block needs equal widths, got {c_in} -> {c_out}")
        conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=not batchnorm)
        bn = nn.BatchNorm2d(c_out) if batchnorm else nn.Identity()
        if batchnorm:
            # the step counter is unused with a fixed momentum; dropping it keeps every
            # state tensor at least 1-D (and out of checkpoints)
            bn.register_buffer("num_batches_tracked", None)
        branch = nn.Sequential(conv, bn)
        self.residual = residual
        self.body = SkippableResidual(branch) if residual else branch
        self.neuron = neuron
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.pool(self.neuron(self.body(h)))


class StagedConvNet(nn.Module):
    """Staged conv net (ANN or spiking LIF); see the module docstring for the computation."""

    def __init__(
        self,
        stages: int = 4,
        widths: tuple[int, ...] = FULL_WIDTHS,
        blocks_per_stage: int = 1,
        classes: int = 100,
        neuron: str = "lif",
        timesteps: int = 4,
        residual: bool = False,
        batchnorm: bool = True,
        width_mult: float = 1.0,
        in_channels: int = 3,
        image_size: int = 32,
        lif: LIFConfig | None = None,
    ) -> None:
        super().__init__()
        if neuron not in NEURONS:
            raise FathomError(f"unknown neuron {neuron!r}; use one of {', '.join(NEURONS)}")
        check_timesteps(timesteps)
        if len(widths) != stages:
            raise FathomError(f"need one width per stage: {stages} stages, widths {widths}")
        if blocks_per_stage < 1:
            raise FathomError(f"blocks_per_stage must be >= 1, got {blocks_per_stage}")
        check_image_size(image_size, stages)
        self.spiking = neuron == "lif" and timesteps > 0
        self.timesteps = timesteps if self.spiking else 0
        self.widths = scaled_widths(tuple(widths), width_mult)
        self.in_channels = in_channels
        self.image_size = image_size
        self.classes = classes
        self.lif_config = (lif or LIFConfig()) if self.spiking else None

        blocks: list[ConvBlock] = []
        c_in = in_channels
        for width in self.widths:
            for i in range(blocks_per_stage):
                blocks.append(
                    ConvBlock(
                        c_in,
                        width,
                        self._neuron(),
                        residual=residual and i > 0,
                        batchnorm=batchnorm,
                        pool=i == blocks_per_stage - 1,
                    )
                )
                c_in = width
        self.blocks = nn.ModuleList(blocks)
        side = image_size // 2**stages
        self.classifier = nn.Linear(self.widths[-1] * side * side, classes)

    def _neuron(self) -> nn.Module:
        return LIF(self.timesteps, self.lif_config) if self.spiking else nn.ReLU()

    @property
    def depth(self) -> int:
        return len(self.blocks)

    # -- the computation --------------------------------------------------------------
    def check_input(self, x: torch.Tensor) -> None:
        """Host-side shape check: ``[B, in_channels, image_size, image_size]``."""
        want = (self.in_channels, self.image_size, self.image_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != want:
            raise FathomError(
                f"StagedConvNet expects images shaped [B, {want[0]}, {want[1]}, {want[2]}], got "
                f"{list(x.shape)}; prepare them with fathom.models.prep.ImageInput"
            )

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Direct encoding: ``[B, C, H, W] -> [B * T, C, H, W]`` (identity for the ANN)."""
        if not self.spiking:
            return x
        return x.unsqueeze(1).expand(-1, self.timesteps, -1, -1, -1).flatten(0, 1)

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """``mean_t linear(flatten(h_t))`` (one timestep for the ANN)."""
        logits = self.classifier(h.flatten(1))
        if not self.spiking:
            return logits
        return logits.unflatten(0, (-1, self.timesteps)).mean(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        h = self.encode(x)
        for block in self.blocks:
            h = block(h)
        return self.readout(h)

    def lyapunov_blocks(self) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        """The conv blocks as maps between per-sample tensors (leading dim = sample).

        Block 1 takes the image ``[B, C, H, W]`` (encoding included); every block returns
        ``[B, T, C, H, W]`` when spiking, ``[B, C, H, W]`` otherwise. The classifier is not
        a block.
        """
        fns: list[Callable[[torch.Tensor], torch.Tensor]] = []
        for i, block in enumerate(self.blocks):
            fns.append(self._per_sample(block, first=i == 0))
        return fns

    def _per_sample(
        self, block: ConvBlock, *, first: bool
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        if not self.spiking:
            return block
        t = self.timesteps

        def fn(h: torch.Tensor) -> torch.Tensor:
            folded = self.encode(h) if first else h.flatten(0, 1)
            return block(folded).unflatten(0, (-1, t))

        return fn

    def neurons(self) -> list[tuple[str, nn.Module]]:
        """``(name, neuron module)`` of every block, shallow to deep."""
        return [(f"blocks.{i}.neuron", b.neuron) for i, b in enumerate(self.blocks)]

    def extra_repr(self) -> str:
        kind = f"spiking LIF T={self.timesteps}" if self.spiking else "ANN ReLU"
        return f"{kind}, depth={self.depth}, widths={self.widths}, image={self.image_size}"


def build(cfg: StagedConvConfig, shape: DataShape) -> ImageInput:
    """The ``staged_conv`` kind's builder (:mod:`fathom.config.model_kinds`): the net behind
    its dataset's image preparation."""
    assert shape.classes is not None and shape.input_shape is not None
    net = StagedConvNet(
        blocks_per_stage=blocks_per_stage_for_depth(cfg.depth),
        classes=shape.classes,
        neuron=cfg.neuron,
        timesteps=cfg.timesteps,
        residual=cfg.residual,
        batchnorm=cfg.batchnorm,
        width_mult=cfg.width_mult,
        in_channels=shape.input_shape[0] if len(shape.input_shape) == 3 else 1,
        image_size=cfg.image_size,
    )
    return ImageInput(net, shape.dataset, cfg.image_size)
