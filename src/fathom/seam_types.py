"""The records of :mod:`fathom.seam`: an instrumented :class:`Layer` and one recorded :class:`Call`.

(Kept apart from :mod:`fathom.seam` so that module stays one screenful of logic; import
both names from :mod:`fathom.seam`.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.utils import _pytree as pytree


@dataclass(frozen=True)
class Layer:
    """One instrumented layer: a module and the parameters it covers.

    ``params`` are the module-relative names (``functional_call`` keys, e.g. ``weight`` or
    ``out_proj.weight``); ``qualified`` the model-level names. ``weights`` / ``biases``
    split them: a parameter whose local name ends in ``bias`` is a bias.
    """

    name: str
    module: nn.Module
    kind: str
    params: tuple[str, ...]
    qualified: tuple[str, ...]

    @property
    def type_name(self) -> str:
        return type(self.module).__name__

    @property
    def weights(self) -> tuple[str, ...]:
        return tuple(p for p in self.params if not p.split(".")[-1].endswith("bias"))

    @property
    def biases(self) -> tuple[str, ...]:
        return tuple(p for p in self.params if p.split(".")[-1].endswith("bias"))

    def tensors(self) -> dict[str, nn.Parameter]:
        """``{local name: parameter}`` of the covered parameters."""
        return {p: self.module.get_parameter(p) for p in self.params}

    def shapes(self) -> dict[str, list[int]]:
        return {p: list(t.shape) for p, t in self.tensors().items()}


@dataclass
class Call:
    """One recorded forward call of a layer: inputs, output, and their example dims.

    ``in_dims`` / ``out_dims`` hold, per pytree leaf, ``None`` (not per-example) or
    ``(dim, k)``: the leaf's dimension ``dim`` has ``k`` consecutive entries per example.
    """

    args: tuple
    kwargs: dict
    output: Any
    in_dims: list
    out_dims: list
    versions: list[int] = field(default_factory=list)

    def input_leaves(self) -> list[Any]:
        return pytree.tree_leaves((self.args, self.kwargs))

    def output_leaves(self) -> list[Any]:
        return pytree.tree_leaves(self.output)
