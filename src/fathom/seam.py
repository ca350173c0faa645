"""The one seam every instrument uses: parametrized layers found by forward hooks.

An instrument never asks what class a model is. :func:`discover` runs the model's own
``forward`` and attributes every use of every parameter to the modules whose forward was
running at that moment (a ``TorchFunctionMode`` sees each torch call; forward pre/post hooks
keep the module stack). Each parameter is covered by the *innermost* module active at all
of its uses, a **layer**; its kind picks the per-example path:

* ``linear``: an ``nn.Linear`` (forward not overridden) covering exactly its own weight and
  bias. Any leading dims: ``z = a W^T + b`` with ``a`` of shape ``[N, ..., d_in]``; every
  position ``t`` of example ``i`` adds ``delta_it a_it^T`` to its gradient (a sequence
  dimension sums over positions);
* ``conv1d`` / ``conv2d``: ``nn.Conv1d/2d`` with zero padding given as numbers, ``groups=1``;
  unfolded patches ``u_it`` make it a linear layer over positions, ``g_i = sum_t delta_it u_it^T``;
* ``generic``: every other module (BatchNorm/LayerNorm affine, Embedding,
  ``nn.MultiheadAttention`` (whose ``out_proj`` is never *called*, so the attention module
  covers it), custom modules, the root model for a parameter used directly in its forward):
  exact per-example gradients by ``torch.func`` — ``functional_call`` of that module on one
  example's captured inputs, ``vjp`` w.r.t. its covered parameters, ``vmap`` over examples,
  in chunks (see :mod:`fathom.pex`).

Nothing is computed over a silent subset of parameters: :attr:`Seam.coverage` maps every
parameter to the layer and path that covers it (or says it is frozen or unused), and
:func:`discover` refuses, naming the module, a parameter that receives gradient but is used
outside every module forward it can see, or a module whose example dimension cannot be
found or that :mod:`torch.func` cannot differentiate per example.

**Examples must be independent.** Per-example quantities exist only when example ``i``'s
loss depends on example ``i``'s input alone. Instruments run in *dense evaluation mode*
(``model.eval()``, every stochastic-depth branch at gain one, dropout off):

* **BatchNorm** then normalizes with its *running* statistics, an affine map per example,
  and its ``weight``/``bias`` are covered by the generic path. In ``train()`` mode (or with
  ``track_running_stats=False``) it normalizes by the *batch* mean and variance, so every
  example's output depends on every other example: ``L_i`` is a function of the whole batch,
  and a per-example gradient is undefined. :func:`discover` refuses such a model.
* **Spiking nets** (:class:`fathom.models.LIF`): the spike is a Heaviside step, whose true
  derivative is zero almost everywhere. Every gradient here is the *surrogate* gradient
  the model trains with (arctan surrogate), i.e. exactly what ``autograd`` returns; the
  time-folded ``[B * T, ...]`` tensors (batch-major) give each example ``T`` positions.

The example dimension of every captured tensor is measured, not guessed: discovery runs the
forward on 2 and 3 examples; the dimension whose size grows by ``k`` per example is the
example dimension (``k > 1`` for folded tensors, e.g. ``k = T`` timesteps) and the
3-example tensor's first rows must reproduce the 2-example ones (independence check).

**Capture.** :meth:`Seam.capture` records, per layer, each call's ``(args, kwargs, output)``
during one ordinary forward (a branch that is skipped records nothing).
:meth:`Seam.cotangents` pulls back output directions: given ``dF/dlogits`` of shape
``[N, C]`` (one direction) or ``[D, N, C]`` (``D`` directions, e.g. ``D = C`` columns of a
loss-Hessian square root for GGN curvature), it returns every layer output's cotangent,
with the same leading ``D``. :func:`fathom.pex.per_example_grads` and
:func:`fathom.pex.per_example_grams` turn ``(layer, calls, cotangents)`` into per-example
gradients ``g_i`` (``[N, *shape]`` or ``[D, N, *shape]``) and Gram matrices
``K_ij = g_i . g_j``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from fathom.errors import FathomError

KINDS: tuple[str, ...] = ("linear", "conv1d", "conv2d", "generic")
ROOT = "<model>"  # the name shown for the root module (its qualified name is "")


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


def _is_float_tensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _check_batchnorm(model: nn.Module) -> None:
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


class _UseRecorder(TorchFunctionMode):
    """Records, for every torch call that receives a parameter, the active module stack
    (metadata reads such as ``.dtype`` or ``.shape`` are not uses)."""

    def __init__(self, params: dict[int, str], stack: list[str]) -> None:
        super().__init__()
        self.params, self.stack, self.uses = params, stack, {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _metadata_access(func):
            return func(*args, **kwargs)
        for leaf in pytree.tree_leaves((args, kwargs)):
            name = self.params.get(id(leaf)) if isinstance(leaf, torch.Tensor) else None
            if name is not None:
                self.uses.setdefault(name, []).append(tuple(self.stack))
        return func(*args, **kwargs)


@contextmanager
def _hooks(model: nn.Module, pre, post, modules: dict[str, nn.Module] | None = None):
    handles = []
    for name, m in (modules or dict(model.named_modules())).items():
        handles.append(m.register_forward_pre_hook(pre(name), with_kwargs=True))
        handles.append(m.register_forward_hook(post(name), with_kwargs=True, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _common_module(stacks: list[tuple[str, ...]]) -> str | None:
    """The innermost module name active in every one of ``stacks`` (``None`` if none)."""
    common = list(stacks[0])
    for s in stacks[1:]:
        n = 0
        while n < min(len(common), len(s)) and common[n] == s[n]:
            n += 1
        common = common[:n]
    return common[-1] if common else None


def _fast_kind(module: nn.Module, covered: set[str]) -> str:
    direct = {n for n, p in module.named_parameters(recurse=False)}
    if covered != direct:
        return "generic"
    if isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward:
        return "linear"
    for cls, kind in ((nn.Conv1d, "conv1d"), (nn.Conv2d, "conv2d")):
        if (
            isinstance(module, cls)
            and type(module).forward is cls.forward
            and module.groups == 1
            and module.padding_mode == "zeros"
            and not isinstance(module.padding, str)
        ):
            return kind
    return "generic"


def _example_dim(a: Any, b: Any, na: int, nb: int, where: str) -> tuple[int, int] | None:
    """``(dim, k)`` of a leaf seen with ``na`` and ``nb`` examples, ``None`` if not per-example."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return None
    if a.shape == b.shape:
        return None
    diff = [d for d in range(a.dim()) if a.dim() == b.dim() and a.shape[d] != b.shape[d]]
    k = (b.shape[diff[0]] - a.shape[diff[0]]) // (nb - na) if len(diff) == 1 else 0
    if len(diff) != 1 or k < 1 or a.shape[diff[0]] != k * na or b.shape[diff[0]] != k * nb:
        raise FathomError(
            f"cannot find the example dimension of {where}: shapes {list(a.shape)} with {na} "
            f"examples and {list(b.shape)} with {nb}; instruments need one dimension that grows "
            "by a fixed number of entries per example"
        )
    d = diff[0]
    a, b = a.detach(), b.detach()
    head = b.narrow(d, 0, a.shape[d])
    same = (
        torch.allclose(head, a, rtol=1e-4, atol=1e-5 * float(a.abs().max().clamp_min(1.0)))
        if a.is_floating_point()
        else torch.equal(head, a)
    )
    if not same:
        raise FathomError(
            f"examples are not independent at {where}: its first {na} examples change when a "
            "further example joins the batch (batch statistics, randomness in train mode, or a "
            "time-major fold); per-example quantities are undefined there — run in eval mode"
        )
    return (d, k)


def _record_calls(model: nn.Module, x: torch.Tensor, recorder: _UseRecorder | None = None):
    """Forward ``x``; every module's calls ``[(args, kwargs, output)]``, first-call order."""
    stack: list[str] = recorder.stack if recorder is not None else []
    calls: dict[str, list] = {}

    def pre(name):
        def hook(m, args, kwargs):
            stack.append(name)
            calls.setdefault(name, [])

        return hook

    def post(name):
        def hook(m, args, kwargs, output):
            stack.pop()
            calls[name].append((args, kwargs, output))

        return hook

    with _hooks(model, pre, post), torch.enable_grad():
        if recorder is not None:
            with recorder:
                out = model(x)
        else:
            out = model(x)
    return out, calls


def _check_logits(out: Any, n: int) -> torch.Tensor:
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != n:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise FathomError(
            f"the model must return logits shaped [N, classes]; on {n} examples it returned "
            f"{shape}; wrap it so that forward returns one row of class scores per example"
        )
    if not out.is_floating_point():
        raise FathomError(
            f"the model returned {out.dtype} outputs; instruments need floating-point logits "
            "(differentiable class scores), not class indices"
        )
    return out


def _coverage(model: nn.Module, uses: dict, logits: torch.Tensor) -> tuple[dict, dict]:
    """``({param: covering module name}, {param: coverage text for uncovered ones})``."""
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
    owner: dict[str, str] = {}
    notes: dict[str, str] = {}
    for name, p in named.items():
        if not p.requires_grad:
            notes[name] = "frozen (requires_grad=False): no gradient"
        elif name in uses:
            owner[name] = _common_module(uses[name])
        elif name in connected:
            module = name.rpartition(".")[0] or ROOT
            raise FathomError(
                f"parameter {name!r} (module {module!r}) receives gradient but is used outside "
                "every module forward the instruments can see (e.g. in a hook or through .data); "
                "use it inside a module's forward so that a layer covers it"
            )
        else:
            notes[name] = "unused by the forward: gradient zero"
    return owner, notes


def discover(model: nn.Module, x: torch.Tensor) -> Seam:
    """Find ``model``'s layers on the example inputs ``x`` (see the module docstring).

    Runs the forward three times on at most 3 examples (repeated if ``x`` has fewer),
    leaving parameters, gradients and the global RNG state as found.
    """
    _check_batchnorm(model)
    named = dict(model.named_parameters())
    if not named:
        raise FathomError(
            f"{type(model).__name__} has no parameters: there is nothing to instrument"
        )
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] == 0:
        raise FathomError("instruments need example inputs with a leading example dimension")
    rng = torch.get_rng_state()
    try:
        recorder = _UseRecorder({id(p): n for n, p in named.items()}, [])
        xb = x[torch.arange(3, device=x.device) % x.shape[0]]
        out_b, calls_b = _record_calls(model, xb, recorder)
        logits = _check_logits(out_b, 3)
        owner, notes = _coverage(model, recorder.uses, logits)
        _, calls_a = _record_calls(model, xb[:2])
    finally:
        torch.set_rng_state(rng)
    modules = dict(model.named_modules())
    order = {name: i for i, name in enumerate(calls_b)}
    layers, dims = [], {}
    for mod_name in sorted(set(owner.values()), key=order.__getitem__):
        qualified = tuple(n for n, o in owner.items() if o == mod_name)
        local = tuple(n[len(mod_name) + 1 :] if mod_name else n for n in qualified)
        module = modules[mod_name]
        label = mod_name or ROOT
        layer = Layer(label, module, _fast_kind(module, set(local)), local, qualified)
        layers.append(layer)
        dims[label] = _call_dims(label, calls_a.get(mod_name, []), calls_b[mod_name])
    seam = Seam(model, tuple(layers), dims, owner, notes)
    seam.self_check(xb)
    return seam


def _call_dims(label: str, calls_a: list, calls_b: list) -> list[tuple[list, list]]:
    if len(calls_a) != len(calls_b):
        raise FathomError(
            f"module {label!r} is called {len(calls_a)} times on 2 examples and {len(calls_b)} "
            "times on 3: its calls depend on the batch size, so they cannot be split per example"
        )
    out = []
    for c, ((aa, ka, oa), (ab, kb, ob)) in enumerate(zip(calls_a, calls_b, strict=True)):
        where_in = f"an input of module {label!r} (call {c})"
        where_out = f"the output of module {label!r} (call {c})"
        la, lb = pytree.tree_leaves((aa, ka)), pytree.tree_leaves((ab, kb))
        oa_l, ob_l = pytree.tree_leaves(oa), pytree.tree_leaves(ob)
        if len(la) != len(lb) or len(oa_l) != len(ob_l):
            raise FathomError(f"module {label!r} changes its call structure with the batch size")
        ins = [_example_dim(a, b, 2, 3, where_in) for a, b in zip(la, lb, strict=True)]
        outs = [_example_dim(a, b, 2, 3, where_out) for a, b in zip(oa_l, ob_l, strict=True)]
        out.append((ins, outs))
    return out


class Seam:
    """A model's layers, their coverage and example dimensions; captures and pullbacks."""

    def __init__(
        self,
        model: nn.Module,
        layers: tuple[Layer, ...],
        dims: dict[str, list[tuple[list, list]]],
        owner: dict[str, str],
        notes: dict[str, str],
    ) -> None:
        self.model = model
        self.layers = layers
        self._dims = dims
        by_module = {layer.name: layer for layer in layers}
        self.coverage: dict[str, str] = {}
        for name in dict(model.named_parameters()):
            if name in owner:
                layer = by_module[owner[name] or ROOT]
                path = "generic torch.func" if layer.kind == "generic" else f"fast {layer.kind}"
                self.coverage[name] = f"{layer.name} ({layer.type_name}, {path})"
            else:
                self.coverage[name] = notes[name]

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise FathomError(
            f"no instrumented layer {name!r}; layers: {[la.name for la in self.layers]}"
        )

    def coverage_table(self) -> str:
        """One line per parameter: ``name  shape  ->  layer (type, path)``."""
        named = dict(self.model.named_parameters())
        return "\n".join(
            f"{n:<40} {list(named[n].shape)!s:<16} -> {c}" for n, c in self.coverage.items()
        )

    @contextmanager
    def capture(self) -> Iterator[dict[str, list[Call]]]:
        """Record each layer's calls during the forwards run inside the block.

        ``with seam.capture() as calls: logits = model(x)`` gives ``calls[layer.name]``, one
        :class:`Call` per forward call (empty for a layer that did not run, e.g. a skipped
        branch). Refuses BatchNorm in train mode (see the module docstring).
        """
        _check_batchnorm(self.model)
        calls: dict[str, list[Call]] = {layer.name: [] for layer in self.layers}
        modules = {layer.name: layer.module for layer in self.layers}

        def pre(name):
            return lambda m, args, kwargs: None

        def post(name):
            def hook(m, args, kwargs, output):
                known = self._dims[name]
                ins, outs = known[min(len(calls[name]), len(known) - 1)]
                call = Call(args, kwargs, output, ins, outs)
                leaves = [*call.input_leaves(), *call.output_leaves()]
                call.versions = [t._version if isinstance(t, torch.Tensor) else 0 for t in leaves]
                calls[name].append(call)

            return hook

        with _hooks(self.model, pre, post, modules):
            yield calls

    def cotangents(
        self,
        calls: dict[str, list[Call]],
        outputs: torch.Tensor,
        grad_outputs: torch.Tensor | None = None,
        *,
        directions: bool = False,
        retain_graph: bool = False,
    ) -> dict[str, list[list[torch.Tensor]]]:
        """``d(<grad_outputs, outputs>)/d(layer output)`` for every float output leaf of every call.

        ``outputs`` is a scalar (e.g. the summed per-example loss; ``grad_outputs=None``) or
        the logits with ``grad_outputs`` of their shape; with ``directions=True``
        ``grad_outputs`` has a leading direction dimension ``D`` and every cotangent gets it
        too (one pullback per direction, batched by autograd when it can). Since example
        ``i`` only reaches the rows of example ``i``, these rows are ``dF_i / dz_i`` exactly.
        A leaf that does not reach ``outputs`` gets zeros.
        """
        slots: list[tuple[str, int, int]] = []
        leaves: list[torch.Tensor] = []
        for name, layer_calls in calls.items():
            for c, call in enumerate(layer_calls):
                self._check_versions(name, call)
                for j, leaf in enumerate(call.output_leaves()):
                    if _is_float_tensor(leaf) and leaf.requires_grad:
                        slots.append((name, c, j))
                        leaves.append(leaf)
        grads = _pullback(outputs, leaves, grad_outputs, directions, retain_graph)
        found = {slot: g for slot, g in zip(slots, grads, strict=True) if g is not None}
        lead = (grad_outputs.shape[0],) if directions and grad_outputs is not None else ()
        out: dict[str, list[list[torch.Tensor]]] = {}
        for name, layer_calls in calls.items():
            out[name] = [
                [
                    found.get((name, c, j))
                    if (name, c, j) in found
                    else torch.zeros(lead + t.shape, dtype=t.dtype, device=t.device)
                    if _is_float_tensor(t)
                    else None
                    for j, t in enumerate(call.output_leaves())
                ]
                for c, call in enumerate(layer_calls)
            ]
        return out

    def _check_versions(self, name: str, call: Call) -> None:
        leaves = [*call.input_leaves(), *call.output_leaves()]
        for t, v in zip(leaves, call.versions, strict=True):
            if isinstance(t, torch.Tensor) and t._version != v:
                raise FathomError(
                    f"an input or output of layer {name!r} was modified in place after the layer "
                    "ran (e.g. ReLU(inplace=True) or x += ...): its recorded value is gone; "
                    "use the out-of-place form"
                )

    def self_check(self, x: torch.Tensor) -> None:
        """Run every generic layer's per-example path on ``x``; its sum over examples must
        match autograd's batch gradient. Refuses, naming the module, where it fails."""
        from fathom.pex import per_example_grads

        generic = [layer for layer in self.layers if layer.kind == "generic"]
        if not generic:
            return
        with self.capture() as calls, torch.enable_grad():
            logits = self.model(x)
        total = logits.square().sum() / 2  # grad_logits = logits: a generic direction
        cots = self.cotangents(calls, total, retain_graph=True)
        for layer in generic:
            tensors = layer.tensors()
            want = torch.autograd.grad(
                total, list(tensors.values()), allow_unused=True, retain_graph=True
            )
            try:
                got = per_example_grads(layer, calls[layer.name], cots[layer.name], int(x.shape[0]))
            except FathomError:
                raise
            except Exception as err:  # torch.func refuses: name the module and the reason
                raise FathomError(
                    f"module {layer.name!r} ({layer.type_name}) cannot be differentiated per "
                    f"example by torch.func (functional_call + vjp + vmap): "
                    f"{type(err).__name__}: {str(err).splitlines()[0]}; make its forward "
                    "functional (no in-place updates of captured tensors, no .item()/.tolist() "
                    "control flow, no randomness) or freeze its parameters"
                ) from err
            for p, w in zip(tensors, want, strict=True):
                ref = torch.zeros_like(tensors[p]) if w is None else w
                tol = 1e-3 * float(ref.abs().max().clamp_min(1e-6))
                if not torch.allclose(got[p].sum(0), ref, rtol=1e-3, atol=tol):
                    raise FathomError(
                        f"module {layer.name!r} ({layer.type_name}): per-example gradients of "
                        f"{p!r} do not add up to the batch gradient, so examples interact inside "
                        "it; per-example quantities are undefined for this module"
                    )


def _pullback(outputs, leaves, grad_outputs, directions: bool, retain_graph: bool):
    if not leaves:
        return []
    if not directions:
        return torch.autograd.grad(
            outputs, leaves, grad_outputs, allow_unused=True, retain_graph=retain_graph
        )
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
        per = [
            torch.autograd.grad(outputs, leaves, g, allow_unused=True, retain_graph=True)
            for g in grad_outputs
        ]
        return [None if col[0] is None else torch.stack(col) for col in zip(*per, strict=True)]
