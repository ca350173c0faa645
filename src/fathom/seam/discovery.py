"""Discovery internals of :mod:`fathom.seam`: refusals up front, recorded calls, example dims.

:func:`fathom.seam.discover` first refuses what no forward should even be run on
(:func:`check_model`: inference mode, BatchNorm in train mode, an ``Embedding`` that would
renormalize its weight in place, global module hooks), then runs the model's forward under
:class:`UseRecorder` (a ``TorchFunctionMode`` that notes, for each torch call receiving a
parameter, the stack of module forwards running at that moment) on 2 and 3 examples and on
the 3 shifted (:mod:`fathom.seam.examples`: the example dimension of every captured
tensor, and the independence checks). :func:`preserved` puts back every tensor a forward left as a plain
module attribute (legacy ``weight_norm`` / ``prune``), so no instrument leaves one behind.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from fathom.errors import FathomError
from fathom.seam.inputs import call
from fathom.seam.types import ROOT


def is_float_tensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def check_inference_mode(what: str = "instruments") -> None:
    if torch.is_inference_mode_enabled():
        raise FathomError(
            f"{what} were called under torch.inference_mode(): it records no autograd graph, "
            "so no gradient, per-example or curvature quantity exists; call them outside "
            "the inference_mode() block (they never change the model)"
        )


def check_batchnorm(model: nn.Module) -> None:
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and (
            m.training or m.running_mean is None
        ):
            why = "is in train() mode" if m.training else "has track_running_stats=False"
            raise FathomError(
                f"BatchNorm module {name or ROOT!r} {why}: it normalizes by the statistics of the "
                "whole batch, so each example's output (and loss) depends on every other example "
                "and per-example gradients are undefined; call model.eval() (running statistics, "
                "examples independent) — fathom.Instruments does this for you"
            )


def check_compiled(model: nn.Module, what: str = "instruments") -> None:
    """Refuse a module compiled by ``torch.compile`` (an ``OptimizedModule``, the root or any
    submodule): its forward runs as fused compiled code, below the module calls and torch
    operations that ``what`` watch; the original module (``._orig_mod``, the same
    parameters) computes the same function in the open."""
    for name, m in model.named_modules():
        if hasattr(m, "_orig_mod") and type(m).__name__ == "OptimizedModule":
            where = "the model" if not name else f"module {name!r}"
            path = "model._orig_mod" if not name else f"model.{name}._orig_mod"
            raise FathomError(
                f"{where} is compiled by torch.compile (OptimizedModule): its forward runs "
                f"as compiled code that {what} cannot watch module by module; pass the "
                f"original module ({path}, which shares its parameters) instead"
            )


def check_model(model: nn.Module) -> None:
    """Refusals that must come before any forward runs (a forward would change the model)."""
    check_inference_mode()
    check_compiled(model)
    check_batchnorm(model)
    for name, m in model.named_modules():
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.max_norm is not None:
            raise FathomError(
                f"module {name or ROOT!r} ({type(m).__name__}) has max_norm={m.max_norm}: every "
                "forward renormalizes rows of its weight in place, so observing it would change "
                "the model; build it with max_norm=None (renormalize in the training step)"
            )
    glob = nn.modules.module
    if glob._global_forward_hooks or glob._global_forward_pre_hooks:
        raise FathomError(
            "global module forward hooks are registered (register_module_forward_hook / "
            "_pre_hook): they change every module's function in ways the instruments cannot "
            "attribute to a module; remove them, or register the hooks on the modules"
        )


_NEVER_TENSORS = frozenset({dict, OrderedDict, set, list, tuple, bool, int, float, str, type(None)})


@contextmanager
def preserved(model: nn.Module):
    """Put back, on exit, every plain tensor attribute of every module (legacy
    ``weight_norm`` / ``prune`` recompute ``weight`` in a forward pre-hook; under
    ``torch.func`` that would leave a transformed tensor in the module)."""
    saved = [
        (m, k, v)
        for m in model.modules()
        for k, v in vars(m).items()
        if type(v) not in _NEVER_TENSORS  # (a module's many dicts and flags, skipped fast)
        and isinstance(v, torch.Tensor)
        and not isinstance(v, nn.Parameter)
    ]
    try:
        yield
    finally:
        for m, k, v in saved:
            m.__dict__[k] = v


# Reading these never carries gradient (metadata, or ``.data`` / ``.grad``): not a use.
_METADATA_NAMES = (
    "dtype shape device layout ndim names requires_grad is_leaf grad_fn grad data _version "
    "is_cuda is_cpu is_sparse is_quantized is_meta is_mkldnn is_nested itemsize nbytes "
    "size dim numel stride element_size is_contiguous is_floating_point is_complex "
    "data_ptr storage_offset __len__ nelement ndimension get_device"
)
_METADATA = frozenset(_METADATA_NAMES.split())


def _metadata_access(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    if name == "__get__":
        name = getattr(getattr(func, "__self__", None), "__name__", "")
    return name in _METADATA


_ATOMS = frozenset({int, float, bool, complex, str, type(None), torch.dtype, torch.device})


def _atom(v: Any) -> bool:
    return type(v) in _ATOMS or (type(v) in (tuple, list) and all(type(e) in _ATOMS for e in v))


def call_tensors(args: tuple, kwargs: dict) -> list:
    """The tensors among a torch call's arguments (those a use is found by, by identity):
    a flat scan when every argument is a tensor, a number, a string, ``None`` or a tuple of
    numbers (``F.linear(x, w, b)``, ``conv2d(x, w, b, (1, 1), ...)``: nearly every call),
    ``pytree.tree_leaves`` otherwise (nested containers, registered pytree nodes)."""
    flat = (*args, *kwargs.values()) if kwargs else args
    if all(isinstance(v, torch.Tensor) or _atom(v) for v in flat):
        return [v for v in flat if isinstance(v, torch.Tensor)]
    return [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]


class UseRecorder(TorchFunctionMode):
    """Records, for every torch call that receives a parameter (by identity), the active
    module stack (metadata reads such as ``.dtype`` or ``.shape`` are not uses), and every
    such call made by the root's own ``forward`` (only the root running) as ``ops``:
    ``(args, kwargs, output, func)``."""

    def __init__(self, params: dict[int, str], stack: list[str]) -> None:
        super().__init__()
        self.params, self.stack, self.uses = params, stack, {}
        self.ops: list[tuple] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _metadata_access(func):
            return func(*args, **kwargs)
        found = False
        for leaf in call_tensors(args, kwargs):
            name = self.params.get(id(leaf))
            if name is not None:
                self.uses.setdefault(name, []).append(tuple(self.stack))
                found = True
        out = func(*args, **kwargs)
        if found and self.stack == [""]:  # the root module alone is running
            self.ops.append((args, kwargs, out, func))
        return out


class OpCapture(TorchFunctionMode):
    """Calls ``record(args, kwargs, output, func)`` for every torch call receiving one of
    ``params`` (by identity): a kind ``op`` layer's calls during a capture."""

    def __init__(self, params: set[int], record) -> None:
        super().__init__()
        self.params, self.record = params, record

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not _metadata_access(func) and any(
            id(t) in self.params for t in call_tensors(args, kwargs)
        ):
            self.record(args, kwargs, out, func)
        return out


@contextmanager
def hooks(model: nn.Module, pre, post, modules: dict[str, nn.Module] | None = None):
    """``pre`` runs before every other pre-hook of a module (it sees the inputs the module
    was called with), ``post`` after every other forward hook (it sees the final output)."""
    handles = []
    for name, m in (dict(model.named_modules()) if modules is None else modules).items():
        handles.append(m.register_forward_pre_hook(pre(name), with_kwargs=True, prepend=True))
        handles.append(m.register_forward_hook(post(name), with_kwargs=True, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def record_calls(
    model: nn.Module,
    x: Any,
    recorder: UseRecorder | None = None,
    finished: list[tuple[str, int]] | None = None,
):
    """Forward ``x``; every module's calls ``[(args, kwargs, output)]``, first-call order
    (``args`` / ``kwargs`` as the module received them, before its own pre-hooks);
    ``finished`` (if given) gets each ``(module, call index)`` in completion order."""
    stack: list[str] = recorder.stack if recorder is not None else []
    calls: dict[str, list] = {}
    pending: dict[str, list] = {}

    def pre(name):
        def hook(m, args, kwargs):
            stack.append(name)
            calls.setdefault(name, [])
            pending.setdefault(name, []).append((args, kwargs))

        return hook

    def post(name):
        def hook(m, args, kwargs, output):
            stack.pop()
            args, kwargs = pending[name].pop()
            if finished is not None:
                finished.append((name, len(calls[name])))
            calls[name].append((args, kwargs, output))

        return hook

    with preserved(model), hooks(model, pre, post), torch.enable_grad():
        if recorder is not None:
            with recorder:
                out = call(model, x)
        else:
            out = call(model, x)
    return out, calls


def pullback(
    outputs, leaves, grad_outputs, directions: bool, retain_graph: bool, batched: bool = True
):
    """``d<grad_outputs, outputs>/d leaf`` for every leaf; with ``directions`` one pullback
    per leading direction of ``grad_outputs`` (batched by autograd where it can and
    ``batched``)."""
    if not leaves:
        return []
    if not directions:
        return torch.autograd.grad(
            outputs, leaves, grad_outputs, allow_unused=True, retain_graph=retain_graph
        )
    if batched:
        try:
            return torch.autograd.grad(
                outputs,
                leaves,
                grad_outputs,
                allow_unused=True,
                retain_graph=True,
                is_grads_batched=True,
            )
        except RuntimeError:  # an op without a batching rule: one pullback per direction
            pass
    per = [
        torch.autograd.grad(outputs, leaves, g, allow_unused=True, retain_graph=True)
        for g in grad_outputs
    ]
    return [None if col[0] is None else torch.stack(col) for col in zip(*per, strict=True)]
