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

The pass is its own forward and backward (``torch.autograd.grad``, never ``.backward()``),
with hooks on the blocks, their branches and their bypasses that are removed before it
returns; the caller holds the model read-only (:func:`fathom.telemetry.instruments.read_only`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from fathom.depth import SkippableResidual
from fathom.telemetry.registry import GRAD, UPDATE


def residual_blocks(model: nn.Module) -> list[tuple[str, SkippableResidual]]:
    """Every :class:`SkippableResidual` of ``model`` with its qualified name, in module order
    (a block registered twice appears once)."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, SkippableResidual)]


class _Sums:
    """Float64 running ``Σ u²`` (the gained branch output) and ``Σ s²`` (the bypass output)."""

    def __init__(self) -> None:
        self.update = 0.0
        self.stream = 0.0
        self.calls = 0


@contextmanager
def _watched(blocks: Sequence[tuple[str, SkippableResidual]]) -> Iterator[dict[str, _Sums]]:
    """Hooks accumulating each block's ``||g f(x)||²`` and ``||s(x)||²`` over its calls. A
    branch or bypass module shared between blocks is credited only to the block being run
    (a stack of the blocks entered)."""
    sums = {name: _Sums() for name, _ in blocks}
    stack: list[str] = []
    handles = []

    def sq(t: torch.Tensor) -> float:
        return float(t.detach().to(torch.float64).square().sum())

    for name, block in blocks:

        def enter(_m, _args, name=name) -> None:
            stack.append(name)
            sums[name].calls += 1

        def leave(_m, _args, _out, name=name) -> None:
            stack.pop()

        def branch(_m, _args, out, name=name, block=block) -> None:
            if stack and stack[-1] == name:
                gain = block.decide()  # dense evaluation: the evaluation gain, no draw
                sums[name].update += sq(out) * float(gain) ** 2

        def bypass(_m, _args, out, name=name) -> None:
            if stack and stack[-1] == name:
                sums[name].stream += sq(out)

        handles += [
            block.register_forward_pre_hook(enter),
            block.register_forward_hook(leave),
            block.branch.register_forward_hook(branch),
            block.bypass.register_forward_hook(bypass),
        ]
    try:
        yield sums
    finally:
        for h in handles:
            h.remove()


def block_rows(
    blocks: Sequence[tuple[str, SkippableResidual]],
    forward: Callable[[], torch.Tensor],
    example_sum: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    *,
    update: bool = True,
    gradient: bool = True,
) -> dict[str, float | None]:
    """``probe/block/update_rel/{block}`` (``update``) and ``grad/block/mean_norm/{block}``
    (``gradient``) of every block (module docstring); ``forward()`` runs the model on the
    probe, ``example_sum(output)`` is ``Σ_i L_i`` over its ``n`` examples."""
    row: dict[str, float | None] = {}
    if not blocks or not (update or gradient):
        return row
    with torch.set_grad_enabled(gradient), _watched(blocks) as sums:
        out = forward()
    if update:
        for name, _ in blocks:
            s = sums[name]
            ok = s.calls > 0 and s.stream > 0.0
            row[f"{UPDATE}/{name}"] = (s.update / s.stream) ** 0.5 if ok else None
    if gradient:
        params = {name: _own(block) for name, block in blocks}
        flat = list({id(p): p for ps in params.values() for p in ps}.values())
        mean = example_sum(out) / n  # d(mean_i L_i)/dθ
        grads = (
            torch.autograd.grad(mean, flat, allow_unused=True)
            if flat and mean.requires_grad
            else [None] * len(flat)
        )
        by_id = {id(p): g for p, g in zip(flat, grads, strict=True)}
        for name, _ in blocks:
            ps = params[name]
            if not ps:
                row[f"{GRAD}/{name}"] = None
                continue
            total = 0.0
            for p in ps:
                g = by_id[id(p)]
                if g is not None:
                    total += float(g.detach().to(torch.float64).square().sum())
            row[f"{GRAD}/{name}"] = total**0.5
    return row


def _own(block: nn.Module) -> list[nn.Parameter]:
    """The block's parameters that require gradients, each once."""
    return [p for p in block.parameters() if p.requires_grad]
