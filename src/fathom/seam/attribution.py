"""Which layer covers which parameter, by identity; which path each layer takes.

:func:`attribute` turns the uses :class:`fathom.seam.discovery.UseRecorder` saw (for every
parameter, by tensor identity, the stack of module forwards active at each torch call that
read it) into :class:`fathom.seam.Layer` s:

* a parameter is covered by the **innermost module active at all of its uses** whose every
  call is per-example (each float output that carries gradient has an example dimension).
  A parametrization's module (``parametrizations.weight``: output the weight, no example
  dimension) or a module called on a parameter alone therefore hands its parameters to the
  enclosing module that consumes them; a parameter used by two sibling modules (tied
  weights) to their common parent; a root parameter passed into a submodule's ``forward``
  to that submodule (the argument is substituted by identity on the generic path);
* names play no part in the attribution; a covered parameter the module does not own gets
  the key ``<model>.<qualified name>`` (:data:`fathom.seam.types.FOREIGN`);
* each parameter's role (weight or bias) comes from the module type that owns it
  (:func:`_param_role`), never from a name suffix.

:func:`_fast_kind` grants a fast path only where it is provably the same function: the exact
class (its ``forward`` not overridden, no instance-level ``forward``), no forward hook or
pre-hook, no parametrization, exactly its own direct parameters covered, and the supported
geometry; otherwise ``generic``, with the reason shown in the coverage table.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.utils import _pytree as pytree

from fathom.errors import FathomError
from fathom.seam.discovery import is_float_tensor
from fathom.seam.examples import call_dims
from fathom.seam.pex_attention import why_not_attention
from fathom.seam.pex_rnn import RECURRENT
from fathom.seam.types import FOREIGN, ROOT, Layer

_BIAS_NAMES: dict[type, frozenset[str]] = {
    nn.MultiheadAttention: frozenset({"in_proj_bias", "bias_k", "bias_v"}),
}


def _param_role(owner: nn.Module, attr: str) -> str:
    """``"weight"`` or ``"bias"`` of parameter ``attr`` of module ``owner``, by module type:
    recurrent layers name their biases ``bias_ih_l0`` / ``bias_hh_l0_reverse``, attention its
    ``in_proj_bias`` / ``bias_k`` / ``bias_v``, every affine layer its ``bias``; a module of
    another type: ``bias`` if ``bias`` is one of the ``_``-separated words of the name."""
    if isinstance(owner, nn.RNNBase):
        return (
            "bias" if attr in owner._flat_weights_names and attr.startswith("bias_") else "weight"
        )
    for cls, names in _BIAS_NAMES.items():
        if isinstance(owner, cls):
            return "bias" if attr in names else "weight"
    return "bias" if attr == "bias" or "bias" in attr.split("_") else "weight"


def _owner_and_attr(model: nn.Module, qualified: str) -> tuple[nn.Module, str]:
    """The module a parameter belongs to and its attribute name there (a parametrized
    tensor ``lin.parametrizations.weight.original0`` belongs to ``lin`` as ``weight``)."""
    path, _, attr = qualified.rpartition(".")
    parts = path.split(".") if path else []
    if len(parts) >= 2 and parts[-2] == "parametrizations":
        attr, parts = parts[-1], parts[:-2]
    return model.get_submodule(".".join(parts)), attr


def _common_prefix(stacks: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The module stack shared by every one of ``stacks`` (outermost first)."""
    common = list(stacks[0])
    for s in stacks[1:]:
        n = 0
        while n < min(len(common), len(s)) and common[n] == s[n]:
            n += 1
        common = common[:n]
    return tuple(common)


def _per_example(calls: list, dims: list) -> bool:
    """Every call has an output with an example dimension, and no float output that
    carries gradient lacks one."""
    for (_, _, output), (_, outs) in zip(calls, dims, strict=True):
        pairs = [
            (t, d)
            for t, d in zip(pytree.tree_leaves(output), outs, strict=True)
            if is_float_tensor(t)
        ]
        if all(d is None for _, d in pairs) or any(d is None and t.requires_grad for t, d in pairs):
            return False
    return True


def _scope(name: str, prefix: tuple[str, ...], calls_b: dict, dims) -> str:
    for module in reversed(prefix):
        if _per_example(calls_b[module], dims(module)):
            return module
    raise FathomError(
        f"parameter {name!r} is used only in module calls whose outputs have no example "
        "dimension (the model's output included), so no module separates its gradient per "
        "example; use it inside a module that maps each example's input to its output"
    )


def attribute(model: nn.Module, uses: dict, calls_a: dict, calls_b: dict) -> tuple[dict, dict]:
    """``({qualified param: covering module name}, {module name: call dims})``."""
    cache: dict[str, list] = {}

    def dims(module: str) -> list:
        if module not in cache:
            cache[module] = call_dims(module or ROOT, calls_a.get(module, []), calls_b[module])
        return cache[module]

    owner = {}
    for name, stacks in uses.items():
        prefix = _common_prefix(stacks)
        if not prefix:
            raise FathomError(
                f"parameter {name!r} is used outside the model's forward (e.g. in a global "
                "hook); use it inside a module's forward so that a layer covers it"
            )
        owner[name] = _scope(name, prefix, calls_b, dims)
    return owner, {m: dims(m) for m in set(owner.values())}


def _key(model: nn.Module, module_name: str, qualified: str) -> str:
    if not module_name:
        return qualified
    local = qualified[len(module_name) + 1 :]
    if qualified.startswith(module_name + "."):
        try:
            if model.get_submodule(module_name).get_parameter(local) is model.get_parameter(
                qualified
            ):
                return local
        except AttributeError:
            pass
    return FOREIGN + qualified


def root_ops(uses: dict, owner: dict, ops_a: list, ops_b: list) -> tuple[list, str] | None:
    """``(call dims, op names)`` of the root's own torch operations when every use of every
    parameter the root covers is one of them and each maps examples to outputs: the root's
    layer is then of kind ``op`` (each operation differentiated alone), not the whole model
    as one generic layer. ``None`` otherwise."""
    mine = [n for n, m in owner.items() if m == ""]
    if not mine or any(stack != ("",) for n in mine for stack in uses[n]):
        return None
    try:
        dims = call_dims(ROOT, [o[:3] for o in ops_a], [o[:3] for o in ops_b])
    except FathomError:
        return None
    if not _per_example([o[:3] for o in ops_b], dims):
        return None
    names = sorted({getattr(o[3], "__name__", type(o[3]).__name__) for o in ops_b})
    return dims, ", ".join(names)


def make_layer(
    model: nn.Module, module_name: str, qualified: tuple[str, ...], dims, ops: str = ""
) -> Layer:
    """The layer of ``module_name`` covering ``qualified``; ``ops``: the root's operation
    names when its layer is of kind ``op`` (:func:`root_ops`)."""
    module = model.get_submodule(module_name)
    keys = tuple(_key(model, module_name, q) for q in qualified)
    roles = tuple(_param_role(*_owner_and_attr(model, q)) for q in qualified)
    kind, reason = ("op", ops) if ops else _fast_kind(module, keys, dims)
    return Layer(module_name or ROOT, module, kind, keys, qualified, roles, reason, model)


_FAST = (
    (nn.Linear, "linear"),
    (nn.Conv1d, "conv1d"),
    (nn.Conv2d, "conv2d"),
    (nn.modules.batchnorm._BatchNorm, "batchnorm"),
    (nn.LayerNorm, "layernorm"),
    (nn.Embedding, "embedding"),
    (nn.MultiheadAttention, "attention"),
)


def _why_generic(module: nn.Module, keys: tuple[str, ...], cls: type, subset: bool = False) -> str:
    """Why a module of a fast class cannot take its fast path ('' when it can)."""
    if "forward" in vars(module):
        return "instance-level forward"
    if type(module).forward is not cls.forward:
        return f"forward overridden by {type(module).__name__}"
    if module._forward_hooks:
        return "forward hook"
    if module._forward_pre_hooks:
        return "forward pre-hook"
    if parametrize.is_parametrized(module):
        return "parametrization"
    foreign = [k[len(FOREIGN) :] for k in keys if k.startswith(FOREIGN)]
    if foreign:
        return f"uses parameter {foreign[0]!r} it does not own"
    attention = isinstance(module, nn.MultiheadAttention)  # out_proj is read, never called
    direct = {n for n, _ in module.named_parameters(recurse=attention)}
    if not set(keys) <= direct:
        return "covers parameters beyond its own"
    if attention:
        return why_not_attention(module)
    if not subset and set(keys) != direct:
        return "another module shares one of its parameters"
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        if module.groups != 1:
            return f"groups={module.groups}"
        if module.padding_mode != "zeros" or isinstance(module.padding, str):
            return f"padding {module.padding!r} ({module.padding_mode})"
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not module.affine:
        return "no affine parameters"
    if isinstance(module, nn.Embedding) and (module.scale_grad_by_freq or module.sparse):
        return "scale_grad_by_freq" if module.scale_grad_by_freq else "sparse gradient"
    return ""


def _fast_kind(module: nn.Module, keys: tuple[str, ...], dims: list) -> tuple[str, str]:
    """``(kind, reason)``: a fast kind (reason ``""``) or ``("generic", why)``."""
    for cls in RECURRENT:
        if isinstance(module, cls):
            why = _why_generic(module, keys, cls, subset=True)
            return ("generic", why) if why else ("recurrent", "")
    for cls, kind in _FAST:
        if isinstance(module, cls):
            why = _why_generic(module, keys, cls)
            first = [ins[0] if ins else None for ins, _ in dims]
            if not why and any(d is None for d in first):
                why = "an input without an example dimension"
            if not why and kind in ("conv1d", "conv2d") and any(d[0] != 0 for d in first):
                why = "example dimension not first"
            return ("generic", why) if why else (kind, "")
    return "generic", f"no closed form for {type(module).__name__}"


def coverage(model: nn.Module, uses: dict, logits) -> tuple[dict, dict]:
    """``({param: its uses' module stacks}, {param: coverage text for uncovered ones})``;
    refuses a parameter that receives gradient but no recorded torch call read."""
    named = dict(model.named_parameters())
    trainable = [n for n, p in named.items() if p.requires_grad]
    grads = (
        torch.autograd.grad(
            logits.sum(), [named[n] for n in trainable], allow_unused=True, retain_graph=True
        )
        if logits.requires_grad
        else [None] * len(trainable)
    )
    connected = {n for n, g in zip(trainable, grads, strict=True) if g is not None}
    used: dict[str, list] = {}
    notes: dict[str, str] = {}
    for name, p in named.items():
        if not p.requires_grad:
            notes[name] = "frozen (requires_grad=False): no gradient"
        elif name in uses:
            used[name] = uses[name]
        elif name in connected:
            module = name.rpartition(".")[0] or ROOT
            raise FathomError(
                f"parameter {name!r} (module {module!r}) receives gradient but is used outside "
                "every module forward the instruments can see (e.g. in a hook or through .data); "
                "use it inside a module's forward so that a layer covers it"
            )
        else:
            notes[name] = "unused by the forward: gradient zero"
    return used, notes
