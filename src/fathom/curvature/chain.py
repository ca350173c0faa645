"""A model seen as a chain of affine taps, and the pullback of output directions onto it.

An *affine chain* is a model whose logits depend on each covered weight ``W_l`` only
through its affine output ``z_l = a_l W_l^T + b_l``. Its tap forward returns the logits and
``(a_l, z_l)`` for every affine layer. Then, for an output direction ``v_i`` (a cotangent
on example ``i``'s logits), the pulled-back direction ``u_il = J_{z_l,i}^T v_i`` gives the
weight-space vector ``u_il a_il^T`` (the gradient of ``v_i . logits_i`` in ``W_l``).

Supported models (anything else is refused, never computed over a subset of layers):

* :class:`fathom.models.ciresan.CiresanMLP` (exact type), through its ``forward_taps``;
* ``nn.Sequential`` of ``nn.Linear``, elementwise activations, ``Identity``, ``Dropout``
  (evaluation: identity) and ``Flatten``.

Every parameter of the model must belong to a covered affine layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from fathom.depth import dense_eval
from fathom.errors import FathomError
from fathom.models.ciresan import CiresanMLP

TapForward = Callable[[torch.Tensor], tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]]

ELEMENTWISE: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.GELU,
    nn.LeakyReLU,
    nn.ELU,
    nn.SiLU,
    nn.Softplus,
    nn.Identity,
    nn.Dropout,
    nn.Flatten,
)

SUPPORTED = "CiresanMLP, or nn.Sequential of nn.Linear and elementwise activations"


@dataclass(frozen=True)
class AffineChain:
    """The covered affine layers of a model, their names, and its tap forward."""

    model: nn.Module
    names: tuple[str, ...]
    layers: tuple[nn.Linear, ...]
    forward_taps: TapForward


def _sequential_taps(seq: nn.Sequential) -> TapForward:
    def forward_taps(x: torch.Tensor):
        h = x.to(next(seq.parameters()).dtype)
        taps = []
        for m in seq:
            if isinstance(m, nn.Linear):
                if h.dim() != 2:
                    raise FathomError(
                        f"nn.Linear received a {h.dim()}-D input {tuple(h.shape)}; curvature "
                        "needs [N, features] at every affine layer: add nn.Flatten() first"
                    )
                z = m(h)
                taps.append((h, z))
                h = z
            else:
                h = m(h)
        return h, taps

    return forward_taps


def affine_chain(model: nn.Module) -> AffineChain:
    """Wrap ``model`` as an :class:`AffineChain`, or raise naming what cannot be covered."""
    kind = type(model).__name__
    if type(model) is CiresanMLP:
        layers = tuple(model.affine_layers())
        body = [f"body{i}" for i in range(len(layers) - 2)]
        names = ("stem", *body, "head")
        taps = model.forward_taps
    elif type(model) is nn.Sequential:
        for i, m in enumerate(model):
            if not isinstance(m, (nn.Linear, *ELEMENTWISE)):
                raise FathomError(
                    f"curvature cannot cover model type Sequential: module {i} is "
                    f"{type(m).__name__}, which is not an affine layer or an elementwise "
                    f"activation. Supported: {SUPPORTED}; rewrite the model in those terms"
                )
        layers = tuple(m for m in model if isinstance(m, nn.Linear))
        if not layers:
            raise FathomError(
                "curvature found no nn.Linear in the Sequential model; nothing to compute"
            )
        names = tuple(f"linear{i}" for i in range(len(layers)))
        taps = _sequential_taps(model)
    else:
        raise FathomError(
            f"curvature does not support model type {kind}. Supported: {SUPPORTED}. "
            "Express the model as one of these (every parameter in an affine layer)"
        )
    covered = {id(p) for lin in layers for p in lin.parameters()}
    stray = [n for n, p in model.named_parameters() if id(p) not in covered]
    if stray:
        raise FathomError(
            f"curvature cannot cover every parameter of model type {kind}: "
            f"{', '.join(stray)} are outside its affine layers. Refusing to compute over a "
            "subset of layers; remove those parameters or use a supported model"
        )
    return AffineChain(model, names, layers, taps)


@contextmanager
def _weights_require_grad(layers: tuple[nn.Linear, ...]) -> Iterator[None]:
    params = [p for lin in layers for p in lin.parameters()]
    saved = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(True)
        yield
    finally:
        for p, s in zip(params, saved, strict=True):
            p.requires_grad_(s)


@dataclass(frozen=True)
class Pullback:
    """Logits ``[N, C]``, layer inputs ``a_l [N, d_in]`` and pulled-back directions.

    ``directions[l]`` is ``[K, N, d_out]``: ``u_kil = J_{z_l,i}^T v_ki`` for the ``K``
    output directions ``v`` returned by ``make_directions(logits)``.
    """

    logits: torch.Tensor
    inputs: list[torch.Tensor]
    directions: list[torch.Tensor]


def pullback(
    chain: AffineChain,
    x: torch.Tensor,
    make_directions: Callable[[torch.Tensor], torch.Tensor],
) -> Pullback:
    """Dense-mode forward, then one batched backward of all ``K`` output directions.

    ``make_directions(logits) -> [K, N, C]``. The backward pulls each direction back to every
    affine output ``z_l`` (``J^T v``, one vectorized reverse pass over the ``K`` directions);
    weight gradients are never formed.
    """
    with dense_eval(chain.model), _weights_require_grad(chain.layers), torch.enable_grad():
        logits, taps = chain.forward_taps(x)
        if len(taps) != len(chain.layers) or any(z is None for _, z in taps):
            raise FathomError(
                f"the tap forward of {type(chain.model).__name__} returned {len(taps)} taps "
                f"for {len(chain.layers)} affine layers (or a skipped branch) in dense mode; "
                "every affine layer must be computed"
            )
        directions = make_directions(logits.detach())
        zs = [z for _, z in taps]
        grads = torch.autograd.grad(logits, zs, grad_outputs=directions, is_grads_batched=True)
    return Pullback(
        logits=logits.detach(),
        inputs=[a.detach() for a, _ in taps],
        directions=[g.detach() for g in grads],
    )
