"""The one seam every instrument uses: parametrized layers found by forward hooks.

An instrument never asks what class a model is. :func:`discover` runs the model's own
``forward`` and attributes every use of every parameter, **by tensor identity**, to the
modules whose forward was running at that moment (a ``TorchFunctionMode`` sees each torch
call; forward pre/post hooks keep the module stack). Each parameter is covered by the
*innermost* module active at all of its uses whose calls map examples to outputs, a
**layer** (:mod:`fathom.seam.attribution`: tied weights go to the common parent, a
parametrization's original to the module it parametrizes, a root parameter passed into a
submodule to that submodule; names play no part). Its kind picks the per-example path; a
fast kind only where it is provably the module's function — the exact class and its
``forward``, no forward hook or pre-hook, no parametrization, no instance-level
``forward``, exactly its own parameters (otherwise ``generic``, the reason in
:attr:`Seam.coverage`):

* ``linear``: an ``nn.Linear`` (forward not overridden) covering exactly its own weight and
  bias. Any leading dims: ``z = a W^T + b`` with ``a`` of shape ``[N, ..., d_in]``; every
  position ``t`` of example ``i`` adds ``delta_it a_it^T`` to its gradient (a sequence
  dimension sums over positions);
* ``conv1d`` / ``conv2d``: ``nn.Conv1d/2d`` with zero padding given as numbers, ``groups=1``;
  unfolded patches ``u_it`` make it a linear layer over positions, ``g_i = sum_t delta_it u_it^T``;
* ``batchnorm`` / ``layernorm``: ``nn.BatchNorm1d/2d/3d`` (affine, in eval mode: running
  statistics) and ``nn.LayerNorm`` (forward not overridden): ``y = x_hat * w + b``, so
  ``g_i(w) = sum_t delta_it * x_hat_it`` and ``g_i(b) = sum_t delta_it`` over positions ``t``
  (``x_hat`` recomputed from the captured input; no per-example forward);
* ``embedding``: ``nn.Embedding`` (no ``max_norm``, ``scale_grad_by_freq`` or sparse
  gradient): ``g_i(W)[v] = sum_{t: tok_it = v} delta_it``, in closed form;
* ``recurrent``: ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` (the stock forward): the functional
  cell of :mod:`fathom.seam.pex_rnn` under ``torch.func`` (the fused kernels cannot be vmapped);
* ``attention``: ``nn.MultiheadAttention`` (packed ``in_proj``, no ``bias_k``/``add_zero_attn``;
  it covers its never-called ``out_proj``): the cotangent pulled back by hand to the q/k/v
  and output projections, linear maps over positions (:mod:`fathom.seam.pex_attention`); a call
  with masks takes the generic path;
* ``op``: the root, for parameters its own ``forward`` reads directly (a positional
  embedding ``h + self.pos``): each torch operation reading them differentiated alone
  (per example, or by masked cotangents), never the whole model;
* ``generic``: every other module (BatchNorm/LayerNorm of a subclass, custom modules): exact per-example gradients by ``torch.func`` — ``functional_call`` of that module on one
  example's captured inputs, ``vjp`` w.r.t. its covered parameters, ``vmap`` over examples,
  in chunks (see :mod:`fathom.seam.pex`).

Nothing is computed over a silent subset of parameters: :attr:`Seam.coverage` maps every
parameter to the layer and path that covers it (or says it is frozen or unused), and
:func:`discover` refuses, naming the module, a parameter that receives gradient but is used
outside every module forward it can see, or a module whose example dimension cannot be
found or that :mod:`torch.func` cannot differentiate per example. Its self-check runs
every layer's path (fast ones too) on the discovery batch: for every covered parameter the
per-example gradients must sum to autograd's batch gradient, so a missed hook or a
misattributed parameter is refused at discovery, never reported. Refused before any
forward runs (:func:`fathom.seam.discovery.check_model`): ``torch.inference_mode()``,
BatchNorm in train mode, an ``Embedding(max_norm=...)`` (its forward renormalizes the
weight in place), global module hooks, a module compiled by ``torch.compile`` (its compiled
forward cannot be watched; pass ``._orig_mod``). Every tensor a forward leaves as a plain module
attribute (legacy ``weight_norm`` / ``prune``) is put back as found. A module's own hooks
are part of its function: the generic path runs them (per example, under ``torch.func``),
so a hook with side effects (one that stores outputs) sees those calls too.

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
3-example tensor's first rows must reproduce the 2-example ones (independence check); a
third forward on the 3 examples shifted by one catches examples that mix causally (a
``cumsum`` over the batch), which appending an example cannot (:mod:`fathom.seam.examples`).

**Inputs and outputs.** ``x`` is a tensor, a tuple or a dict of tensors with a leading
example dimension, passed as ``model(x)``, ``model(*x)`` or ``model(**x)``
(:mod:`fathom.seam.inputs`: every slice of examples, the discovery batch included, goes
through it); ``discover(..., output=...)`` selects the output of a model returning a tuple
or a mapping (:meth:`Seam.forward`), and ``loss=`` says how it is read
(:func:`fathom.losses.read_output`, the one layout checker: default cross-entropy over
``[N, C]``; a layout it cannot read is refused at discovery).

**Capture.** :meth:`Seam.capture` records, per layer, each call's ``(args, kwargs, output)``
during one ordinary forward (a branch that is skipped records nothing).
:meth:`Seam.cotangents` pulls back output directions: given ``dF/dlogits`` of shape
``[N, C]`` (one direction) or ``[D, N, C]`` (``D`` directions, e.g. ``D = C`` columns of a
loss-Hessian square root for GGN curvature), it returns every layer output's cotangent,
with the same leading ``D``. :func:`fathom.seam.pex.per_example_grads` and
:func:`fathom.seam.pex.per_example_grams` turn ``(layer, calls, cotangents)`` into per-example
gradients ``g_i`` (``[N, *shape]`` or ``[D, N, *shape]``) and Gram matrices
``K_ij = g_i . g_j``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from functools import partial

import torch
from torch import nn

from fathom.errors import FathomError
from fathom.losses.kinds import CrossEntropy, Loss
from fathom.losses.layout import Selector, read_output, select_output
from fathom.seam import inputs
from fathom.seam.attribution import attribute, coverage, make_layer, root_ops
from fathom.seam.check import run_self_check
from fathom.seam.discovery import (
    OpCapture,
    UseRecorder,
    check_batchnorm,
    check_inference_mode,
    check_model,
    hooks,
    is_float_tensor,
    pullback,
    record_calls,
)
from fathom.seam.examples import SHIFT, check_mixing
from fathom.seam.inputs import count, take
from fathom.seam.types import ROOT, Call, Layer

__all__ = ["LAYER_KINDS", "Call", "Layer", "Seam", "discover"]

LAYER_KINDS: tuple[str, ...] = (
    "linear",
    "conv1d",
    "conv2d",
    "batchnorm",
    "layernorm",
    "embedding",
    "attention",
    "recurrent",
    "op",
    "generic",
)


def discover(model: nn.Module, x, *, output: Selector = None, loss: Loss | None = None) -> Seam:
    """Find ``model``'s layers on the example inputs ``x`` (see the module docstring).

    ``x`` is a tensor, a tuple or a dict of tensors with a leading example dimension
    (:mod:`fathom.seam.inputs`); ``output`` selects the output of a model returning a tuple
    or a mapping, and ``loss`` (default: cross-entropy over ``[N, C]``) says how that output
    is read (:func:`fathom.losses.read_output`, the one layout checker: a layout the loss
    cannot read is refused here, by name). Runs the forward three times on at most 3
    examples (repeated if ``x`` has fewer), leaving parameters, gradients, module
    attributes and the global RNG state as found.
    """
    check_model(model)
    named = dict(model.named_parameters())
    if not named:
        raise FathomError(
            f"{type(model).__name__} has no parameters: there is nothing to instrument"
        )
    n = count(x)
    rng = torch.get_rng_state()
    try:
        recorder = UseRecorder({id(p): n for n, p in named.items()}, [])
        xb = take(x, [i % n for i in range(3)])
        out_b, calls_b = record_calls(model, xb, recorder)
        logits = read_output(out_b, 3, loss or CrossEntropy(), output)
        uses, notes = coverage(model, recorder.uses, logits)
        recorder_a = UseRecorder(recorder.params, [])
        _, calls_a = record_calls(model, take(xb, slice(0, 2)), recorder_a)
        finished: list[tuple[str, int]] = []
        _, calls_r = record_calls(model, take(xb, list(SHIFT)), finished=finished)
    finally:
        torch.set_rng_state(rng)
    types = {name: type(m).__name__ for name, m in model.named_modules()}
    check_mixing(calls_a, calls_b, calls_r, finished, types)
    owner, dims = attribute(model, uses, calls_a, calls_b)
    ops = root_ops(uses, owner, recorder_a.ops, recorder.ops)
    if ops is not None:
        dims[""] = ops[0]
    order = {name: i for i, name in enumerate(calls_b)}
    modules = sorted(set(owner.values()), key=order.__getitem__)
    layers = tuple(
        make_layer(
            model,
            m,
            tuple(n for n in named if owner.get(n) == m),
            dims[m],
            ops[1] if ops is not None and m == "" else "",
        )
        for m in modules
    )
    by_label = {m or ROOT: dims[m] for m in modules}
    seam = Seam(model, layers, by_label, {n: m or ROOT for n, m in owner.items()}, notes)
    seam.output, seam.loss = output, loss
    seam.self_check(xb)
    return seam


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
        self._owner, self._notes = owner, notes
        self.batched_pullback = True  # autograd's is_grads_batched (the self-check may say no)
        self.output: Selector = None  # which output of the forward (fathom.losses.layout)
        self.loss: Loss | None = None  # the loss discovery read that output with
        self._cover()

    def forward(self, x):
        """The selected output of the model's forward on ``x`` (a tensor, a tuple or a dict
        of tensors: :func:`fathom.seam.inputs.call`)."""
        return select_output(inputs.call(self.model, x), self.output)

    def _cover(self) -> None:
        by_module = {layer.name: layer for layer in self.layers}
        self.coverage: dict[str, str] = {}
        for name in dict(self.model.named_parameters()):
            if name in self._owner:
                layer = by_module[self._owner[name]]
                self.coverage[name] = f"{layer.name} ({layer.type_name}, {layer.path})"
            else:
                self.coverage[name] = self._notes[name]

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
        check_inference_mode()
        check_batchnorm(self.model)
        calls: dict[str, list[Call]] = {layer.name: [] for layer in self.layers}
        modules = {la.name: la.module for la in self.layers if la.kind != "op"}
        pending: dict[str, list] = {name: [] for name in modules}

        def record(name, args, kwargs, output, func=None):
            known = self._dims[name]
            ins, outs = known[min(len(calls[name]), len(known) - 1)]
            call = Call(args, kwargs, output, ins, outs, func=func)
            leaves = [*call.input_leaves(), *call.output_leaves()]
            call.versions = [t._version if isinstance(t, torch.Tensor) else 0 for t in leaves]
            calls[name].append(call)

        def pre(name):
            def hook(m, args, kwargs):
                pending[name].append((args, kwargs))

            return hook

        def post(name):
            def hook(m, args, kwargs, output):
                record(name, *pending[name].pop(), output)

            return hook

        with ExitStack() as stack:
            stack.enter_context(hooks(self.model, pre, post, modules))
            for la in self.layers:  # the root's own operations (kind op), by identity
                if la.kind == "op":
                    params = {id(t) for t in la.tensors().values()}
                    stack.enter_context(OpCapture(params, partial(record, la.name)))
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
                    if is_float_tensor(leaf) and leaf.requires_grad:
                        slots.append((name, c, j))
                        leaves.append(leaf)
        grads = pullback(
            outputs, leaves, grad_outputs, directions, retain_graph, self.batched_pullback
        )
        found = {slot: g for slot, g in zip(slots, grads, strict=True) if g is not None}
        lead = (grad_outputs.shape[0],) if directions and grad_outputs is not None else ()
        out: dict[str, list[list[torch.Tensor]]] = {}
        for name, layer_calls in calls.items():
            out[name] = [
                [
                    found.get((name, c, j))
                    if (name, c, j) in found
                    else torch.zeros(lead + t.shape, dtype=t.dtype, device=t.device)
                    if is_float_tensor(t)
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

    def self_check(self, x) -> None:
        """Run every layer's per-example path on ``x`` (fast, recurrent and generic alike),
        for two output directions one at a time and stacked: for every covered parameter
        (by identity) the sum over examples must match autograd's batch gradient, and the
        stacked directions the looped ones. Refuses, naming the module and the parameter,
        where it fails: a fast path that missed a hook, a parameter attributed to the wrong
        call, or examples that interact would all show up here; a layer where only torch's
        batched pullback fails or is wrong (``torch.cdist``, ``nn.PReLU``) takes its
        directions one at a time instead (:mod:`fathom.seam.check`; below float64 a
        mismatch is confirmed on a float64 copy first: rounding noise of a gradient that
        cancels to zero is no reason to refuse an exact path)."""
        run_self_check(self, x, partial(discover, output=self.output, loss=self.loss))

    def loop_directions(self, names: set[str]) -> None:
        """Pull several output directions back through the named layers one at a time."""
        self.layers = tuple(
            replace(la, loop_directions=True) if la.name in names else la for la in self.layers
        )
        self._cover()
