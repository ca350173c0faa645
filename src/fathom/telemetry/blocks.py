"""Per-block telemetry: one number per residual block (every
:class:`fathom.depth.SkippableResidual` of the model, named by its qualified module name),
measured on the probe in dense evaluation mode.

For block ``b`` with input ``x``, bypass ``s(x)`` (the identity for a GPT block, a crop for
a Ciresan block) and branch ``f(x)``, dense evaluation computes ``y = s(x) + g_b f(x)`` with
``g_b`` the evaluation gain (one; ``1 − p`` under the ``huang`` convention)::

    update_rel_b = ||g_b f(X)||_F / ||s(X)||_F
    grad_norm_b  = sqrt( sum over the block's parameters θ of ||d(mean_i L_i)/dθ||_F^2 )

``X`` stacks the block's input for every probe example (for a language model every token
position of every probe window; for a conv net every channel and pixel): the Frobenius norms
run over all those entries jointly, accumulated in float64 over every call of the block (a
block called twice counts both calls). ``update_rel`` is the size of the block's update to
the residual stream relative to the stream it is added to; ``None`` for a block not called
on the probe or whose ``||s(X)||`` is zero. ``grad_norm`` is the norm of the probe mean
gradient over every parameter the block owns (``block.parameters()``, each once; weights,
biases, LayerNorm gains alike), ``L_i`` example ``i``'s loss as the loss defines it
(:meth:`fathom.losses.Terms.example_sum`: a window's mean token cross-entropy for a language
model); a parameter the loss does not reach contributes zero; ``None`` for a block without
parameters that require gradients.

Both come from the instruments' one probe pass (:meth:`fathom.telemetry.Instruments.observe`),
with no forward or backward of their own:

* ``update_rel``: :func:`watched` adds up ``Σ (g_b f)²`` and ``Σ s²`` in float64 during the
  probe forward only (a stock block's own ``forward`` with its branch and bypass wrapped,
  hooks for any other; removed before any pullback, so no per-example path ever runs them);
  it only reads outputs;
* ``grad_norm``: the probe mean gradient's squared norm per seam layer is what the
  ``gradients`` family already has, ``||m_W||² + ||m_b||²`` (``grad/mean/weight_norm`` from
  the layer's per-example Gram, ``||m||² = (1/N²) Σ_ij K_ij``, and ``grad/mean/bias_norm``,
  each squared back); a block sums the layers whose parameters it owns entirely
  (:class:`BlockPlan`). A trainable parameter of the block outside every such layer (covered
  by a layer that also covers parameters outside the block, e.g. a weight tied across the
  boundary, or one the seam saw unused) is differentiated directly, only those, on the same
  graph before the seam's pullback (``torch.autograd.grad`` of the mean loss with the graph
  kept); the stock models (GPT, Ciresan) have none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from fathom.depth import SkippableResidual, skippable_residual
from fathom.seam.types import Layer
from fathom.telemetry.registry import GRAD, UPDATE


def residual_blocks(model: nn.Module) -> list[tuple[str, SkippableResidual]]:
    """Every :class:`SkippableResidual` of ``model`` with its qualified name, in module order
    (a block registered twice appears once)."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, SkippableResidual)]


class _Sums:
    """Per block, each call's float64 ``Σ f²`` of the branch output with the square of its
    gain (``Σ (g f)² = g² Σ f²``, multiplied in Python floats at the end) and ``Σ s²`` of
    the bypass output (0-d tensors, read back once for all blocks)."""

    def __init__(self) -> None:
        self.update: list[tuple[torch.Tensor, float]] = []
        self.stream: list[torch.Tensor] = []
        self.calls = 0


def _sq(t: torch.Tensor) -> torch.Tensor:
    """``||t||_F`` accumulated in float64 (a 0-d tensor on ``t``'s device: no host read
    here); squared back on the host (within an ulp of ``Σ t²``)."""
    return torch.linalg.vector_norm(t.detach(), dtype=torch.float64)


def _stock(block: SkippableResidual) -> bool:
    """Whether ``block`` runs :class:`SkippableResidual`'s own ``forward`` (no subclass
    override, no instance-level ``forward``)."""
    return type(block).forward is SkippableResidual.forward and "forward" not in vars(block)


def _watching_forward(
    block: SkippableResidual, name: str, sums: _Sums, stack: list[str] | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``SkippableResidual.forward`` (``skippable_residual(x, branch, bypass, decide())``, the
    same calls in the same order, so the same bits) with the branch and bypass wrapped to
    add up their outputs' squares: exactly this block's calls, no hook involved. ``stack``:
    the blocks entered, kept only where some block is watched by hooks."""
    gains: list[float] = [1.0]  # this call's gain, read by the branch wrapper

    def branch(h: torch.Tensor) -> torch.Tensor:
        out = block.branch(h)
        sums.update.append((_sq(out), gains[0] * gains[0]))
        return out

    def bypass(h: torch.Tensor) -> torch.Tensor:
        out = block.bypass(h)
        sums.stream.append(_sq(out))
        return out

    def forward(x: torch.Tensor) -> torch.Tensor:
        gain = block.decide()  # dense evaluation: the evaluation gain, no draw
        gains[0] = float(gain)
        sums.calls += 1
        if stack is None:
            return skippable_residual(x, branch, bypass, gain)
        stack.append(name)
        try:
            return skippable_residual(x, branch, bypass, gain)
        finally:
            stack.pop()

    return forward


@contextmanager
def watched(blocks: Sequence[tuple[str, SkippableResidual]]) -> Iterator[dict[str, _Sums]]:
    """Accumulate each block's ``||g f(x)||²`` and ``||s(x)||²`` over its calls during the
    forwards run inside the block; every trace of it is removed on exit.

    A block running the stock ``forward`` gets, for the block's duration, an instance-level
    ``forward`` that is the stock one with its branch and bypass wrapped
    (:func:`_watching_forward`: ~2x cheaper than four hooks per block, measured on the
    Ciresan MLP × 0.1). Any other block (a subclass with its own ``forward``) gets hooks on
    itself, its branch and its bypass; a branch or bypass module shared between blocks is
    credited only to the block being run (a stack of the blocks entered, which the stock
    blocks push too). Either way the sums are taken as each output is made, before anything
    later in the forward could change it in place, and nothing else changes: the outputs
    are the same bits, and the seam's capture hooks on the layers inside see the same calls.
    """
    sums = {name: _Sums() for name, _ in blocks}
    stack: list[str] = []
    stock = [(name, block) for name, block in blocks if _stock(block)]
    handles = []
    for name, block in blocks:
        if _stock(block):
            continue

        def enter(_m, _args, name=name) -> None:
            stack.append(name)
            sums[name].calls += 1

        def leave(_m, _args, _out) -> None:
            stack.pop()

        def branch(_m, _args, out, name=name, block=block) -> None:
            if stack and stack[-1] == name:
                gain = float(block.decide())  # dense evaluation: the evaluation gain, no draw
                sums[name].update.append((_sq(out), gain * gain))

        def bypass(_m, _args, out, name=name) -> None:
            if stack and stack[-1] == name:
                sums[name].stream.append(_sq(out))

        handles += [
            block.register_forward_pre_hook(enter),
            block.register_forward_hook(leave, always_call=True),
            block.branch.register_forward_hook(branch),
            block.bypass.register_forward_hook(bypass),
        ]
    try:
        for name, block in stock:
            vars(block)["forward"] = _watching_forward(
                block, name, sums[name], stack if handles else None
            )
        yield sums
    finally:
        for _, block in stock:
            vars(block).pop("forward", None)
        for h in handles:
            h.remove()


def update_rows(sums: Mapping[str, _Sums]) -> dict[str, float | None]:
    """``probe/block/update_rel/{block}`` from :func:`watched`'s sums (module docstring);
    one host read for all blocks."""
    parts = [t for s in sums.values() for t in (*(u for u, _ in s.update), *s.stream)]
    values = iter(torch.stack(parts).tolist() if parts else [])
    row: dict[str, float | None] = {}
    for name, s in sums.items():
        update = 0.0
        for _, g2 in s.update:
            v = next(values)
            update += v * v * g2
        stream = 0.0
        for _ in s.stream:
            v = next(values)
            stream += v * v
        ok = s.calls > 0 and stream > 0.0
        row[f"{UPDATE}/{name}"] = (update / stream) ** 0.5 if ok else None
    return row


@dataclass(frozen=True)
class BlockPlan:
    """Where each block's mean gradient norm comes from: ``layers[b]``, the seam layers whose
    covered parameters the block owns entirely (their squared mean-gradient norms are
    summed), and ``direct[b]``, the block's other trainable parameters (differentiated
    directly); ``owns[b]``: whether the block has a trainable parameter at all."""

    layers: dict[str, tuple[str, ...]]
    direct: dict[str, tuple[nn.Parameter, ...]]
    owns: dict[str, bool]

    @classmethod
    def of(
        cls, blocks: Sequence[tuple[str, SkippableResidual]], layers: Sequence[Layer]
    ) -> BlockPlan:
        covers = {la.name: {id(t) for t in la.tensors().values()} for la in layers}
        by_layer: dict[str, tuple[str, ...]] = {}
        direct: dict[str, tuple[nn.Parameter, ...]] = {}
        owns: dict[str, bool] = {}
        for name, block in blocks:
            own = {id(p): p for p in block.parameters() if p.requires_grad}
            whole = tuple(n for n, ids in covers.items() if ids and ids <= own.keys())
            done = set().union(*(covers[n] for n in whole))
            by_layer[name] = whole
            direct[name] = tuple(p for i, p in own.items() if i not in done)
            owns[name] = bool(own)
        return cls(by_layer, direct, owns)

    def parameters(self) -> list[nn.Parameter]:
        """Every parameter some block takes directly, each once."""
        return list({id(p): p for ps in self.direct.values() for p in ps}.values())

    def rows(
        self, layer_sq: Mapping[str, float], direct_sq: Mapping[int, float]
    ) -> dict[str, float | None]:
        """``grad/block/mean_norm/{block}`` from the layers' squared mean-gradient norms
        (``layer_sq``; a layer absent there was not called: zero) and the directly
        differentiated parameters' (``direct_sq`` by ``id``; absent: not reached, zero)."""
        row: dict[str, float | None] = {}
        for name, layers in self.layers.items():
            if not self.owns[name]:
                row[f"{GRAD}/{name}"] = None
                continue
            total = 0.0
            for layer in layers:
                total += layer_sq.get(layer, 0.0)
            for p in self.direct[name]:
                total += direct_sq.get(id(p), 0.0)
            row[f"{GRAD}/{name}"] = total**0.5
        return row


def direct_squares(mean: torch.Tensor, params: Sequence[nn.Parameter]) -> dict[int, float]:
    """``{id(θ): ||d mean/dθ||²}`` (float64) for the given parameters, on ``mean``'s graph,
    which is kept for the pullback that follows."""
    if not params or not mean.requires_grad:
        return {}
    grads = torch.autograd.grad(mean, list(params), allow_unused=True, retain_graph=True)
    return {
        id(p): float(g.detach().to(torch.float64).square().sum())
        for p, g in zip(params, grads, strict=True)
        if g is not None
    }
