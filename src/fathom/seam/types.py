"""The records of :mod:`fathom.seam`: an instrumented :class:`Layer` and one recorded :class:`Call`.

The bottom of the seam package: every module of :mod:`fathom.seam` (discovery, attribution,
the per-example paths ``pex*``, the self-check) builds on these records and on nothing of
:mod:`fathom.seam` itself, so the package has no import circle; users import both names from
:mod:`fathom.seam`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

ROOT = "<model>"  # the name shown for the root module (its qualified name is "")
FOREIGN = ROOT + "."  # key prefix of a parameter a layer uses but does not own


@dataclass(frozen=True)
class Layer:
    """One instrumented layer: a module and the parameters it covers.

    ``params`` are the keys of its per-example gradients: for a parameter the module owns,
    its module-relative name (``weight``, ``out_proj.weight``,
    ``parametrizations.weight.original``); for a parameter it uses without owning it (a
    root parameter passed into it, a sibling's weight), ``<model>.`` + its qualified name.
    ``qualified`` are the model-level names (``model.named_parameters()``), ``roles`` each
    parameter's role (``weight`` or ``bias``, :mod:`fathom.seam.attribution`:
    by the owning module's type, never by a name suffix); ``reason`` says why a module
    takes the generic path (empty on a fast path); ``root`` is the model the names refer to;
    ``loop_directions``: several output directions are pulled back through it one at a time
    (set by the self-check where torch's batched pullback fails or is wrong,
    :mod:`fathom.seam.check`).
    """

    name: str
    module: nn.Module
    kind: str
    params: tuple[str, ...]
    qualified: tuple[str, ...]
    roles: tuple[str, ...] = ()
    reason: str = ""
    root: nn.Module | None = field(default=None, repr=False, compare=False)
    loop_directions: bool = False

    @property
    def type_name(self) -> str:
        return type(self.module).__name__

    @property
    def path(self) -> str:
        """The coverage table's path text: ``fast linear``, ``generic torch.func: <why>``,
        ``recurrent torch.func (functional cell)`` (every report of a layer's path uses it),
        with ``; one output direction at a time`` where :attr:`loop_directions`."""
        loop = "; one output direction at a time" if self.loop_directions else ""
        return self._path() + loop

    def _path(self) -> str:
        if self.kind == "generic":
            return f"generic torch.func: {self.reason}" if self.reason else "generic torch.func"
        if self.kind == "recurrent":
            return "recurrent torch.func (functional cell)"
        if self.kind == "op":
            # a plain ``x + p`` in closed form (fathom.seam.pex_functional.add_grads), others by vjp
            return f"root operations ({self.reason}), each alone, x + p closed-form, others by torch.func"
        return f"fast {self.kind}"

    def _role(self, i: int) -> str:
        return self.roles[i] if self.roles else "weight"

    @property
    def weights(self) -> tuple[str, ...]:
        return tuple(p for i, p in enumerate(self.params) if self._role(i) == "weight")

    @property
    def biases(self) -> tuple[str, ...]:
        return tuple(p for i, p in enumerate(self.params) if self._role(i) == "bias")

    @property
    def foreign(self) -> tuple[str, ...]:
        """Keys of the parameters this layer uses without owning them."""
        return tuple(p for p in self.params if p.startswith(FOREIGN))

    def tensors(self) -> dict[str, nn.Parameter]:
        """``{key: parameter}`` of the covered parameters (looked up by qualified name)."""
        if self.root is None:
            return {p: self.module.get_parameter(p) for p in self.params}
        return {p: self.root.get_parameter(q) for p, q in zip(self.params, self.qualified)}

    def shapes(self) -> dict[str, list[int]]:
        return {p: list(t.shape) for p, t in self.tensors().items()}


@dataclass
class Call:
    """One recorded forward call of a layer: inputs, output, and their example dims.

    ``args`` / ``kwargs`` are the inputs as the call received them (before any forward
    pre-hook of the module changed them), ``output`` the result after its forward hooks.
    A layer of kind ``op`` records one call per torch operation of the root's ``forward``
    that reads one of its parameters (``func``: that operation).
    ``in_dims`` / ``out_dims`` hold, per pytree leaf, ``None`` (not per-example) or
    ``(dim, k)``: the leaf's dimension ``dim`` has ``k`` consecutive entries per example.
    """

    args: tuple
    kwargs: dict
    output: Any
    in_dims: list
    out_dims: list
    versions: list[int] = field(default_factory=list)
    func: Any = None  # the torch function of a root operation's call (kind "op")
    _leaves: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def input_leaves(self) -> list[Any]:
        """The pytree leaves of ``(args, kwargs)`` (flattened once: a call's inputs are
        never rebound)."""
        if "in" not in self._leaves:
            if not self.kwargs and all(isinstance(a, torch.Tensor) for a in self.args):
                self._leaves["in"] = list(self.args)  # what tree_leaves gives, without it
            else:
                self._leaves["in"] = pytree.tree_leaves((self.args, self.kwargs))
        return list(self._leaves["in"])

    def output_leaves(self) -> list[Any]:
        """The pytree leaves of ``output`` (flattened once)."""
        if "out" not in self._leaves:
            out = self.output
            plain = isinstance(out, torch.Tensor)
            self._leaves["out"] = [out] if plain else pytree.tree_leaves(out)
        return list(self._leaves["out"])
