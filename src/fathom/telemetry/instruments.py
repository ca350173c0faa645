"""``fathom.Instruments``: probe telemetry on any ``nn.Module`` that returns logits.

``Instruments(model, x_probe, y_probe, families="all").observe(optimizer=opt)`` returns
``{field: float | None}`` (names and formulas in :mod:`fathom.telemetry.registry`), per
layer keyed by the layer's qualified module name, the layers found by :mod:`fathom.seam` on
the model's own forward. It is read-only by construction:

* the probe runs in dense evaluation mode (:func:`fathom.depth.dense_eval`: ``eval()``,
  every stochastic-depth branch at gain one); every module's train/eval flag and every
  buffer (a call counter a forward updates in place) is restored;
* gradients come from ``torch.autograd.grad`` on the layer outputs, never ``.backward()``,
  so no ``.grad`` tensor is created, changed or freed;
* parameters and optimizer state are only read;
* the global CPU (and, if initialised, CUDA) RNG states are saved and restored.

The layers are discovered at the first observation (so its cost falls on the telemetry
clock's cold start) and **re-derived whenever what they depend on changed**: every access
to :attr:`Instruments.seam` compares :func:`fathom.seam.key.structure_key` (module and
parameter identities, shapes, dtypes, ``requires_grad`` flags, hooks, attributes; the key
the curvature twin uses) with the one the seam was found under — a frozen backbone
unfrozen, a head swapped, a hook added — and rediscovers on any difference (then the field
names follow the new layers); unchanged, it costs one walk over the modules. ``params``
fields measure displacement from the parameters as they were when the ``Instruments``
object was created (or from ``initial_params``); a parameter that appears later (a new
head) is measured from its value when first seen, and one without a reference of its
shape gets ``None``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fathom.depth import dense_eval, state_kept
from fathom.errors import FathomError
from fathom.losses.kinds import CrossEntropy, Loss, Terms, make_loss
from fathom.losses.layout import Selector
from fathom.seam import Call, Seam, discover
from fathom.seam.discovery import check_inference_mode, preserved
from fathom.seam.inputs import count, take
from fathom.seam.key import structure_key
from fathom.seam.pex import gram_and_bias_mean, rows_gram
from fathom.telemetry import params as P
from fathom.telemetry.blocks import BlockPlan, direct_squares, residual_blocks, update_rows, watched
from fathom.telemetry.distributions import activation_summary, entry_summary, quantile_key
from fathom.telemetry.gradient_fields import NORM_QUANTILES
from fathom.telemetry.moments import moments_from_grams, norm_quantiles
from fathom.telemetry.registry import expected_names, resolve_families

Value = float | int | None | list
_PROBE_FAMILIES: tuple[str, ...] = ("probe", "activations", "backprop", "gradients", "moments")
_MOMENT_KEYS = (
    "mean_sq_norm",
    "diversity",
    "max_share",
    "participation",
    "cos_cyclic_mean",
    "noise_scale",
    "cov_along_mean",
)


@contextmanager
def read_only(model: nn.Module) -> Iterator[None]:
    """Dense evaluation for the block; restores every module's flag and the masks
    (:func:`fathom.depth.dense_eval`), buffers (:func:`fathom.depth.state_kept`), plain
    tensor attributes (:func:`fathom.seam.discovery.preserved`) and RNG states."""
    cpu_rng = torch.get_rng_state()
    cuda_rng = (
        torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else None
    )
    try:
        with dense_eval(model), state_kept(model), preserved(model):
            yield
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _joint_norm(values: list[float | None]) -> float | None:
    """``sqrt(sum v^2)`` of per-tensor norms (the norm of their concatenation); ``None`` if
    any is missing or there are none; a single norm is returned as is."""
    if not values or any(v is None for v in values):
        return None
    if len(values) == 1:
        return values[0]
    return sum(v * v for v in values) ** 0.5


# -- per-layer probe rows: activation and backprop summaries from a layer's recorded calls
# (example dimension first, every other entry a unit)


def _first_input(leaves: list[Any]) -> torch.Tensor | None:
    j = _first_index(leaves)
    return None if j is None else leaves[j]


def _first_index(leaves: list[Any]) -> int | None:
    """Index of the first floating-point tensor leaf (the layer's input activation)."""
    return next(
        (j for j, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.is_floating_point()),
        None,
    )


def _per_example_rows(t: torch.Tensor, dim: tuple[int, int] | None, n: int) -> torch.Tensor:
    """``[N, units]``: example dimension first, every other entry a unit."""
    if dim is None:
        return t.detach().reshape(1, -1).expand(n, -1)
    d, _ = dim
    return t.detach().movedim(d, 0).reshape(n, -1)


def _activation_row(name: str, calls: list[Call], n: int) -> dict[str, Value]:
    parts = []
    for call in calls:
        leaves = call.input_leaves()
        j = _first_index(leaves)
        if j is not None:
            parts.append(_per_example_rows(leaves[j], call.in_dims[j], n))
    h = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)) if parts else torch.empty(0)
    return {f"probe/act/{key}/{name}": v for key, v in activation_summary(h).items()}


def _delta_row(name: str, calls: list[Call], cots: list, n: int) -> dict[str, Value]:
    parts = []
    for call, cot in zip(calls, cots, strict=True):
        j = next((j for j, t in enumerate(cot) if t is not None), None)
        if j is not None:
            parts.append(_per_example_rows(cot[j], call.out_dims[j], n))
    d = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)) if parts else torch.empty(0)
    return {f"probe/delta/{key}/{name}": v for key, v in entry_summary(d).items()}


class Instruments:
    """Probe telemetry of any model (module docstring); ``with Instruments(...) as ins:`` closes it."""

    def __init__(
        self,
        model: nn.Module,
        x_probe: torch.Tensor,
        y_probe: torch.Tensor,
        families: str | Iterable[str] = "all",
        *,
        initial_params: Mapping[str, torch.Tensor] | None = None,
        loss: str | Loss = "cross_entropy",
        output: Selector = None,
        class_dim: int | None = None,
    ) -> None:
        names = (families,) if isinstance(families, str) else tuple(families)
        chosen = resolve_families(names)
        if "scores" in chosen and names != ("all",):
            raise FathomError(
                "the 'scores' family needs whole data splits; Instruments measures a probe — "
                "use the trainer's telemetry (telemetry.families) for per-class split scores"
            )
        self.families = tuple(f for f in chosen if f != "scores")
        self.loss = make_loss(loss, class_dim=class_dim)
        self.output = output
        if not isinstance(y_probe, torch.Tensor):
            raise FathomError("y_probe must be a tensor (the targets of the loss, one per example)")
        n = count(x_probe, "x_probe")
        ce = isinstance(self.loss, CrossEntropy)
        if ce and y_probe.dim() < 2 and (y_probe.is_floating_point() or y_probe.is_complex()):
            raise FathomError(
                f"y_probe must be a 1-D tensor of integer class labels, got {y_probe.dtype} "
                f"{list(y_probe.shape)}"
            )
        if y_probe.dim() == 0 or y_probe.shape[0] != n:
            raise FathomError(
                f"x_probe has {n} examples and y_probe {y_probe.shape[0] if y_probe.dim() else 0} "
                "labels; pass one label per example (at least one)"
            )
        self.model = model
        self.x = x_probe
        self.y = y_probe if y_probe.is_floating_point() else y_probe.long()
        self.terms: Terms | None = None  # the loss read on the probe (at discovery)
        self._own_initial = initial_params is None
        self.initial = (
            dict(initial_params)
            if initial_params is not None
            else {k: v.detach().clone() for k, v in model.named_parameters()}
        )
        self._seen = {k: weakref.ref(v) for k, v in model.named_parameters()}
        self._seam: Seam | None = None
        self._key: tuple | None = None
        self._held: list = []
        self._names: list[str] | None = None
        self._scratch: dict = {}  # float64 work space of the params family's norms
        self._reused: dict[tuple[str, str], tuple[torch.Tensor, Any] | None] = {}
        self.inputs: tuple[str, ...] = ()
        self.blocks: tuple[str, ...] = ()  # the residual blocks' names (at discovery)
        self._blocks: list = []  # (name, module) of each block (at discovery)
        self._plan: BlockPlan | None = None  # where each block's gradient norm comes from
        self.classes = 0
        self.closed = False

    def __enter__(self) -> Instruments:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Let go of the model (the end of a ``with Instruments(...) as ins:`` block): the
        seam, the references its structure key holds and the displacement references are
        dropped; a later :meth:`observe` is refused. Observing leaves no hook on the model
        and every piece of state as found, so nothing else needs restoring."""
        self._seam, self._key, self._held, self._names = None, None, [], None
        self._blocks, self._plan = [], None
        self.initial, self._seen, self._scratch, self.closed = {}, {}, {}, True
        self._reused = {}

    # -- structure ------------------------------------------------------------------------
    @property
    def seam(self) -> Seam:
        """The model's layers, discovered in dense evaluation mode, and rediscovered
        whenever the model's structure key changed (module docstring)."""
        self._check_open()
        with read_only(self.model):
            return self._fresh_seam()

    def _check_open(self) -> None:
        if self.closed:
            raise FathomError(
                "this Instruments object is closed (its `with` block ended); create a new one "
                "to observe the model again"
            )
        check_inference_mode()

    def _fresh_seam(self) -> Seam:
        """:attr:`seam`, inside a :func:`read_only` block (the key is taken in dense mode)."""
        key, held = structure_key(self.model, self.x)
        if self._seam is None or key != self._key:
            self._discover()
            self._key, self._held = key, held
        assert self._seam is not None
        return self._seam

    def _discover(self) -> None:
        with read_only(self.model), torch.enable_grad():
            seam = discover(self.model, self.x, output=self.output, loss=self.loss)
            with seam.capture() as calls:
                out = seam.forward(take(self.x, slice(0, 3)))
        n = int(self.y.shape[0])
        if isinstance(self.loss, CrossEntropy) and out.dim() == 2 and self.y.dim() == 1:
            classes = int(out.shape[1])
            valid = self.y[self.y != self.loss.ignore_index]
            if valid.numel() and (int(valid.max()) >= classes or int(valid.min()) < 0):
                raise FathomError(
                    f"y_probe holds labels outside 0 .. {classes - 1} (the model has "
                    f"{classes} logits); relabel or change the classifier"
                )
        self.terms = self.loss.terms((n, *out.shape[1:]), self.y)
        self.inputs = tuple(
            layer.name
            for layer in seam.layers
            if calls[layer.name]
            and (a := _first_input(calls[layer.name][0].input_leaves())) is not None
            and a.requires_grad
        )
        self._blocks = residual_blocks(self.model)
        self.blocks = tuple(name for name, _ in self._blocks)
        self._plan = BlockPlan.of(self._blocks, seam.layers)
        for name, p in self.model.named_parameters() if self._own_initial else ():
            seen = self._seen.get(name)
            if seen is None or seen() is not p:  # a new parameter: measured from first sight
                self.initial[name] = p.detach().clone()
                self._seen[name] = weakref.ref(p)
        self.classes, self._seam, self._names, self._reused = (
            self.terms.layout.classes,
            seam,
            None,
            {},
        )

    @property
    def layers(self):
        return self.seam.layers

    def field_names(self) -> list[str]:
        """The names ``observe`` returns, in registry order (expanded once)."""
        if self._names is None:
            layers = [layer.name for layer in self.layers]
            self._names = expected_names(
                self.families, layers, (), self.classes, self.inputs, self.blocks
            )
        return list(self._names)

    def layer_records(self) -> list[dict[str, Any]]:
        """Per instrumented layer: name, module type, path kind and covered parameter shapes."""
        return [
            {
                "name": layer.name,
                "type": layer.type_name,
                "kind": layer.kind,
                "params": dict(zip(layer.qualified, layer.shapes().values(), strict=True)),
            }
            for layer in self.layers
        ]

    # -- measurement ----------------------------------------------------------------------
    def observe(
        self,
        optimizer: torch.optim.Optimizer | None = None,
        initial_params: Mapping[str, torch.Tensor] | None = None,
        lr: float | None = None,
    ) -> dict[str, float | None]:
        """Every selected family now; leaves every piece of state as found.

        ``lr``: the rate of the last update, for the update ratios (default: the optimizer's
        ``param_group["lr"]``, :func:`fathom.telemetry.params.sgd_last_update_norm`)."""
        self._check_open()
        fams = set(self.families)
        row: dict[str, Value] = {}
        with read_only(self.model), torch.enable_grad():  # one read-only block for everything
            seam = self._fresh_seam()
            if fams & set(_PROBE_FAMILIES):
                row.update(self._probe(seam, fams))
            if "params" in fams:
                initial = self.initial if initial_params is None else initial_params
                row.update(self.param_fields(optimizer, initial, lr, layers=seam.layers))
        names = self._names if self._names is not None else self.field_names()
        return {name: row[name] for name in names}

    def _probe(self, seam: Seam, fams: set[str]) -> dict[str, Value]:
        """The probe families from one forward with capture and one pullback; the residual
        blocks' fields ride on the same pass (:mod:`fathom.telemetry.blocks`)."""
        row: dict[str, Value] = {}
        needs_delta = bool(fams & {"backprop", "gradients", "moments"})
        n = int(self.y.shape[0])
        updates = "activations" in fams and bool(self._blocks)
        block_grads = "gradients" in fams and bool(self._blocks)
        with (
            torch.set_grad_enabled(needs_delta),
            seam.capture() as calls,
            watched(self._blocks if updates else []) as sums,
        ):
            logits = seam.forward(self.x)
        y, terms = self.y, self.terms
        assert terms is not None
        if "probe" in fams:
            row.update(self._probe_scores(logits.detach(), y))
        if "activations" in fams:
            for name in self.inputs:
                row.update(_activation_row(name, calls[name], n))
        if updates:
            row.update(update_rows(sums))
        if not needs_delta:
            return row
        # delta_i = dL_i/dz_i: the gradient of the summed per-example losses sum_i L_i
        # (fathom.losses.Terms.example_sum) w.r.t. each layer output z; example i only
        # reaches the rows of example i, so they are dL_i/dz_i.
        total = terms.example_sum(logits)
        plan = self._plan
        direct = plan.parameters() if block_grads and plan is not None else []
        direct_sq = direct_squares(total / n, direct) if direct else {}  # none in stock models
        cots = seam.cotangents(calls, total)
        if "backprop" in fams:
            for layer in seam.layers:
                row.update(_delta_row(layer.name, calls[layer.name], cots[layer.name], n))
        if fams & {"gradients", "moments"}:
            layer_sq: dict[str, float] = {}
            row.update(self._gradient_rows(seam, calls, cots, n, fams, layer_sq))
            if block_grads and plan is not None:
                row.update(plan.rows(layer_sq, direct_sq))
        return row

    def _probe_scores(self, logits: torch.Tensor, y: torch.Tensor) -> dict[str, Value]:
        """``probe/ce`` and ``probe/acc`` (their registry definitions: cross-entropy over
        ``[N, C]`` integer labels); ``None`` for any other loss or layout, where they are
        not defined."""
        plain = (
            isinstance(self.loss, CrossEntropy)
            and logits.dim() == 2
            and not y.is_floating_point()
            and not self.loss.label_smoothing
            and not bool((y == self.loss.ignore_index).any())
        )
        if not plain:
            return {"probe/ce": None, "probe/acc": None}
        losses = F.cross_entropy(logits, y, reduction="none").to(torch.float64)
        return {
            "probe/ce": float(losses.mean()),
            "probe/acc": float((logits.argmax(dim=1) == y).double().mean()),
        }

    def _gradient_rows(self, seam, calls, cots, n, fams, layer_sq=None) -> dict[str, Value]:
        """The ``gradients`` and ``moments`` rows of every layer from its per-example Gram
        and bias mean; ``layer_sq`` (if given, with ``gradients``) gets each called layer's
        squared mean-gradient norm ``||m_W||² + ||m_b||²`` (its two reported norms squared
        back, for the residual blocks)."""
        row: dict[str, Value] = {}
        stats = {
            layer.name: gram_and_bias_mean(
                layer,
                calls[layer.name],
                cots[layer.name],
                n,
                input_gram=lambda a, k=layer.name: self._reuse(("gram", k), a, rows_gram),
            )
            for layer in seam.layers
            if calls[layer.name]
        }
        with_gram = [name for name, (k, _) in stats.items() if k is not None]
        grams = torch.stack([stats[name][0] for name in with_gram]) if with_gram else None
        moments = moments_from_grams(grams) if grams is not None else []
        by_name = dict(zip(with_gram, moments, strict=True))
        quantiles = dict(zip(with_gram, norm_quantiles(grams), strict=True)) if with_gram else {}
        for layer in seam.layers:
            _, bias_mean = stats.get(layer.name, (None, None))
            mom = by_name.get(layer.name)
            if "gradients" in fams:
                row[f"grad/mean/weight_norm/{layer.name}"] = None if mom is None else mom.mean_norm
                row[f"grad/mean/bias_norm/{layer.name}"] = (
                    None if bias_mean is None else float(bias_mean.norm())
                )
                if layer_sq is not None and layer.name in stats:
                    w = 0.0 if mom is None else mom.mean_norm
                    b = row[f"grad/mean/bias_norm/{layer.name}"]
                    layer_sq[layer.name] = w * w + (0.0 if b is None else b * b)
            if "moments" in fams:
                for key in _MOMENT_KEYS:
                    row[f"grad/pex/{key}/{layer.name}"] = None if mom is None else getattr(mom, key)
                values = quantiles.get(layer.name, [None] * (len(NORM_QUANTILES) + 1))
                for q, v in zip(NORM_QUANTILES, values, strict=False):
                    row[f"grad/pex/norm_{quantile_key(q)}/{layer.name}"] = v
                row[f"grad/pex/norm_max/{layer.name}"] = values[-1]
        return row

    def _reuse(self, key: tuple[str, str], t: torch.Tensor | None, compute: Callable) -> Any:
        """``compute(t)``, or the value computed at an earlier observation from a tensor equal
        to ``t`` bit for bit (a layer that reads the probe through parameter-free operations,
        the first layer, sees the same input at every observation: its input Gram ``A A^T``
        is the same matrix). A copy of ``t`` is kept only while it has not changed; a key
        whose tensor changed once is computed afresh from then on."""
        if t is None:
            return compute(t)
        held = self._reused.get(key, ())
        if held is None:  # changed before: never kept again (until rediscovery)
            return compute(t)
        if held:
            seen, value = held
            if (seen.shape, seen.dtype, seen.device) == (t.shape, t.dtype, t.device) and _equal(
                seen, t
            ):
                return value
            self._reused[key] = None
            return compute(t)
        value = compute(t)
        self._reused[key] = (t.detach().clone(), value)
        return value

    def param_fields(
        self,
        optimizer: torch.optim.Optimizer | None,
        initial: Mapping[str, torch.Tensor],
        lr: float | None = None,
        *,
        layers: list | None = None,
    ) -> dict[str, Value]:
        """The ``params`` family: norms, displacement, momentum and update ratios per layer
        (``layers``: the seam's, when the caller has just checked it)."""
        row: dict[str, Value] = {}
        layers = self.layers if layers is None else layers
        named = [(n, p, _reference(initial, n, p)) for n, p in self.model.named_parameters()]
        norms = P.Norms(self._scratch)  # each norm below taken once
        for layer in layers:
            tensors = layer.tensors()
            qual = dict(zip(layer.params, layer.qualified, strict=True))
            ws = [(tensors[p], _reference(initial, qual[p], tensors[p])) for p in layer.weights]
            w_norm = _joint_norm([norms.frob(w) for w, _ in ws])
            disp = _joint_norm([None if w0 is None else norms.displacement(w, w0) for w, w0 in ws])
            opt_norms = (
                [norms.momentum_norm(w, optimizer) for w, _ in ws]
                if optimizer is not None
                else [None]
            )
            updates = (
                [norms.sgd_last_update_norm(w, optimizer, lr) for w, _ in ws]
                if optimizer is not None
                else [None]
            )
            name = layer.name
            row[f"param/weight_norm/{name}"] = w_norm
            row[f"param/bias_norm/{name}"] = _joint_norm(
                [norms.frob(tensors[b]) for b in layer.biases]
            )
            row[f"param/disp/{name}"] = disp
            row[f"param/disp_rel/{name}"] = P.ratio(
                disp, _joint_norm([norms.frob(w0, reference=True) for _, w0 in ws])
            )
            row[f"param/momentum_norm/{name}"] = _joint_norm(opt_norms)
            row[f"param/update_ratio/{name}"] = P.ratio(_joint_norm(updates), w_norm)
        parts = [None if w0 is None else norms.displacement(p, w0) for _, p, w0 in named]
        row["param/disp_total"] = _joint_norm(parts)
        return row


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` (same values; NaN equals nothing, ``-0.0 == 0.0``), by numpy on the
    CPU (its comparison is vectorized: ~6x faster than ``torch.equal`` on 10^5 floats)."""
    if a.device.type == "cpu" and a.dtype in (torch.float32, torch.float64):
        return bool(np.array_equal(a.detach().numpy(), b.detach().numpy()))
    return bool(torch.equal(a, b))


def _reference(
    initial: Mapping[str, torch.Tensor], name: str, p: torch.Tensor
) -> torch.Tensor | None:
    """The displacement reference of ``p``: ``initial[name]`` if it has ``p``'s shape."""
    w0 = initial.get(name)
    return w0 if w0 is not None and w0.shape == p.shape else None
