"""The Ciresan MLP's affine taps and hand MAC formula, references for the tests.

A test-side re-derivation of :meth:`fathom.models.ciresan.CiresanMLP.forward` that also
returns each affine layer's input and output; the tests compare its logits with the
model's own forward, so a drift between the two fails there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fathom.models.ciresan import CiresanMLP


def forward_taps(
    model: CiresanMLP, x: torch.Tensor
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor | None]]]:
    """Logits plus ``(a, z)`` for every affine layer, in order stem, body..., head.

    ``a`` is the layer input, ``z = a W^T + b`` the affine output (for a body block the
    branch output *before* the crop is added). A skipped branch (gain 0) has no tap: its
    entry is ``(a, None)``.
    """
    taps: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    a = model.prepare(x)
    z = model.stem(a)
    taps.append((a, z))
    h = model.stem_dropout(F.relu(z))
    for block in model.blocks:
        if block.residual:
            gain = block.res.decide()
            if not isinstance(gain, torch.Tensor) and gain == 0.0:
                taps.append((h, None))
                h = block.dropout(F.relu(block.res.bypass(h)))
                continue
            z = block.linear(h)
            taps.append((h, z))
            one = not isinstance(gain, torch.Tensor) and gain == 1.0
            pre = block.res.bypass(h) + (z if one else z * gain)
        else:
            z = block.linear(h)
            taps.append((h, z))
            pre = z
        h = block.dropout(F.relu(pre))
    z = model.head(h)
    taps.append((h, z))
    return (F.relu(z) if model.output_relu else z), taps


def macs_per_example(model: CiresanMLP, mask: tuple[int | bool, ...] | None = None) -> int:
    """Multiply-accumulates of one forward pass by hand: ``sum_l in_l * out_l`` over the stem,
    the head and the body branches ``l`` with ``mask[l]`` (all without a mask); the
    reference the FLOP counter (:func:`fathom.audit.costs.mask_macs`) is tested against."""
    layers = model.affine_layers()
    body = layers[1:-1]
    kept = (1,) * len(body) if mask is None else mask
    macs = sum(lin.in_features * lin.out_features for lin in (layers[0], layers[-1]))
    for lin, m in zip(body, kept, strict=True):
        macs += lin.in_features * lin.out_features * int(bool(m))
    return macs
