"""How a model's output is read: which output, where its classes are, how many positions.

One checker for every instrument (:func:`read_output`): the seam's discovery, a factory
model's check before training, curvature, telemetry and the audit all read a model's
output through it, so a layout is refused in one place, by name, before any number is
computed on a misread one.

**Which output.** A model may return a tensor, a tuple (or list) or a mapping (a ``dict``,
HF's ``ModelOutput``). ``output=None`` takes a returned tensor as is and refuses a tuple or a
mapping, naming what it holds; ``output="logits"`` takes that key of a mapping (or attribute
of an output object), ``output=0`` that entry of a tuple.

**Where the classes are** (cross-entropy only; the elementwise losses, MSE and BCE, read every
output entry alone). The output ``z`` is ``[N, *out]`` with a leading example dimension.
``class_dim`` names the dimension holding the ``C`` classes, counted in the whole output
(``class_dim=1``: PyTorch's ``[N, C, d1, ...]``, as ``F.cross_entropy`` reads it;
``class_dim=-1``: ``[N, T, V]`` sequences, the vocabulary last). Every other dimension
after the examples is a *position*. ``[N, C]`` needs no ``class_dim``; a longer output
without one is refused, since ``[N, T, V]`` read by PyTorch's convention would take the
``T`` positions for classes, a number computed on a misread layout.

**The canonical view.** :meth:`Layout.canon` maps ``[*lead, N, *out]`` to ``[*lead, N, P, C]``
(``P`` positions per example in the output's own order, ``C`` classes; an elementwise loss
has ``P = E`` entries and ``C = 1``); :meth:`Layout.uncanon` maps it back exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from fathom.errors import FathomError

Selector = str | int | None


@dataclass(frozen=True)
class Layout:
    """An output shape ``[N, *out]`` read as ``[N, P, C]`` (module docstring).

    ``class_dim`` is the (non-negative) dimension of the classes in the whole output, or
    ``None`` for an elementwise loss (every entry its own position, ``C = 1``)."""

    shape: tuple[int, ...]
    class_dim: int | None

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def entries(self) -> int:
        """``E``: output entries per example."""
        return math.prod(self.shape[1:])

    @property
    def classes(self) -> int:
        return 1 if self.class_dim is None else self.shape[self.class_dim]

    @property
    def positions(self) -> int:
        return self.entries // max(1, self.classes)

    @property
    def position_shape(self) -> tuple[int, ...]:
        """The output shape without its class dimension (the shape of integer targets)."""
        if self.class_dim is None:
            return self.shape
        return self.shape[: self.class_dim] + self.shape[self.class_dim + 1 :]

    def with_examples(self, n: int) -> Layout:
        return replace(self, shape=(n, *self.shape[1:]))

    def canon(self, t: torch.Tensor) -> torch.Tensor:
        """``[*lead, N, *out] -> [*lead, N, P, C]``."""
        lead = t.dim() - len(self.shape)
        head = t.shape[:lead]
        if self.class_dim is None:
            return t.reshape(*head, t.shape[lead], -1, 1)
        moved = t.movedim(lead + self.class_dim, -1)
        return moved.reshape(*head, t.shape[lead], -1, self.classes)

    def uncanon(self, t: torch.Tensor) -> torch.Tensor:
        """``[*lead, N, P, C] -> [*lead, N, *out]`` (the inverse of :meth:`canon`)."""
        lead = t.dim() - 3
        head, n = t.shape[:lead], t.shape[lead]
        if self.class_dim is None:
            return t.reshape(*head, n, *self.shape[1:])
        moved = (*self.position_shape[1:], self.classes)
        return t.reshape(*head, n, *moved).movedim(-1, lead + self.class_dim)


def select_output(out: Any, output: Selector = None) -> Any:
    """The output an instrument reads from what the model's forward returned (module
    docstring); a tuple or mapping without a selector, or a selector that names nothing
    there, is refused naming what the model returned."""
    if output is None:
        if isinstance(out, Mapping):
            raise FathomError(
                f"the model returned a mapping with keys {list(out)}; name the output to read "
                "with output='<key>' (e.g. output='logits')"
            )
        if isinstance(out, (tuple, list)):
            raise FathomError(
                f"the model returned a {type(out).__name__} of {len(out)} outputs; name the one "
                "to read with output=<index> (e.g. output=0)"
            )
        return out
    if isinstance(output, bool) or not isinstance(output, (str, int)):
        raise FathomError(
            f"output={output!r} is neither a key nor an index: pass output='logits' for a "
            "model returning a mapping, output=0 for one returning a tuple"
        )
    if isinstance(output, str):
        if isinstance(out, Mapping) and output in out:
            return out[output]
        if not isinstance(out, (Mapping, torch.Tensor, tuple, list)) and hasattr(out, output):
            return getattr(out, output)
        keys = list(out) if isinstance(out, Mapping) else type(out).__name__
        raise FathomError(
            f"output={output!r}: the model's output has no such key (it returned {keys}); "
            "name one of its keys, or leave output unset for a model returning a tensor"
        )
    if isinstance(out, (tuple, list)) and -len(out) <= output < len(out):
        return out[output]
    what = f"{len(out)} outputs" if isinstance(out, (tuple, list)) else type(out).__name__
    raise FathomError(
        f"output={output}: the model returned {what}; name an index of its tuple, a key of "
        "its mapping, or leave output unset for a model returning a tensor"
    )


def read_output(out: Any, n: int, loss: Any, output: Selector = None) -> torch.Tensor:
    """The one layout checker: the selected output of a forward on ``n`` examples, a
    floating tensor ``[n, *out]`` whose layout ``loss`` can read (``loss.layout``: a
    :class:`fathom.losses.Loss`), or a :class:`FathomError` naming the problem and the fix."""
    z = select_output(out, output)
    if not isinstance(z, torch.Tensor) or z.dim() == 0 or z.shape[0] != n:
        shape = list(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise FathomError(
            f"the model must return logits shaped [N, classes] (or [N, *outputs] with a "
            f"loss= that reads them); on {n} examples it returned {shape}; wrap it so that "
            "forward returns one row of outputs per example"
        )
    if not z.is_floating_point():
        raise FathomError(
            f"the model returned {z.dtype} outputs; instruments need floating-point logits "
            "(differentiable class scores), not class indices"
        )
    loss.layout(tuple(z.shape))
    return z
