"""``fathom.Instruments``: probe telemetry on any ``nn.Module`` that returns logits.

``Instruments(model, x_probe, y_probe, families="all").observe(optimizer=opt)`` returns
``{field: float | None}`` (names and formulas in :mod:`fathom.telemetry.registry`), per
layer keyed by the layer's qualified module name, the layers found by :mod:`fathom.seam` on
the model's own forward. It is read-only by construction:

* the probe runs in dense evaluation mode (:func:`fathom.depth.dense_eval`: ``eval()``,
  every stochastic-depth branch at gain one); every module's train/eval flag is restored;
* gradients come from ``torch.autograd.grad`` on the layer outputs, never ``.backward()``,
  so no ``.grad`` tensor is created, changed or freed;
* parameters and optimizer state are only read;
* the global CPU (and, if initialised, CUDA) RNG states are saved and restored.

The layers are discovered at the first observation (so its cost falls on the telemetry
clock's cold start). ``params`` fields measure displacement from the parameters as they were
when the ``Instruments`` object was created (or from ``initial_params``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fathom.depth import dense_eval
from fathom.errors import FathomError
from fathom.pex import gram_and_bias_mean
from fathom.seam import Call, Seam, discover
from fathom.seam_discovery import preserved
from fathom.telemetry import params as P
from fathom.telemetry.distributions import (
    entry_summary,
    quantile_key,
    zero_fractions,
)
from fathom.telemetry.moments import moments_from_grams
from fathom.telemetry.registry import NORM_QUANTILES, expected_names, resolve_families

Value = float | int | None | list
PROBE_FAMILIES: tuple[str, ...] = ("probe", "activations", "backprop", "gradients", "moments")
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
    """Dense evaluation for the block; restores module flags, masks, plain tensor attributes
    (:func:`fathom.seam_discovery.preserved`) and RNG states."""
    flags = [(m, m.training) for m in model.modules()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = (
        torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else None
    )
    try:
        with dense_eval(model), preserved(model):
            yield
    finally:
        for m, flag in flags:
            m.training = flag
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def joint_norm(values: list[float | None]) -> float | None:
    """``sqrt(sum v^2)`` of per-tensor norms (the norm of their concatenation); ``None`` if
    any is missing or there are none; a single norm is returned as is."""
    if not values or any(v is None for v in values):
        return None
    if len(values) == 1:
        return values[0]
    return sum(v * v for v in values) ** 0.5


def _first(leaves: list[Any]) -> torch.Tensor | None:
    j = _first_index(leaves)
    return None if j is None else leaves[j]


def _first_index(leaves: list[Any]) -> int | None:
    """Index of the first floating-point tensor leaf (the layer's input activation)."""
    return next(
        (j for j, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.is_floating_point()),
        None,
    )


def _per_example(t: torch.Tensor, dim: tuple[int, int] | None, n: int) -> torch.Tensor:
    """``[N, units]``: example dimension first, every other entry a unit."""
    if dim is None:
        return t.detach().reshape(1, -1).expand(n, -1)
    d, _ = dim
    return t.detach().movedim(d, 0).reshape(n, -1)


class Instruments:
    """Probe telemetry of any model; see the module docstring."""

    def __init__(
        self,
        model: nn.Module,
        x_probe: torch.Tensor,
        y_probe: torch.Tensor,
        families: str | Iterable[str] = "all",
        *,
        initial_params: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        names = (families,) if isinstance(families, str) else tuple(families)
        chosen = resolve_families(names)
        if "scores" in chosen and names != ("all",):
            raise FathomError(
                "the 'scores' family needs whole data splits; Instruments measures a probe — "
                "use the trainer's telemetry (telemetry.families) for per-class split scores"
            )
        self.families = tuple(f for f in chosen if f != "scores")
        if not isinstance(x_probe, torch.Tensor) or not isinstance(y_probe, torch.Tensor):
            raise FathomError("x_probe and y_probe must be tensors (inputs and integer labels)")
        if y_probe.dim() != 1 or y_probe.is_floating_point() or y_probe.is_complex():
            raise FathomError(
                f"y_probe must be a 1-D tensor of integer class labels, got {y_probe.dtype} "
                f"{list(y_probe.shape)}"
            )
        if x_probe.dim() == 0 or x_probe.shape[0] != y_probe.shape[0] or y_probe.numel() == 0:
            raise FathomError(
                f"x_probe has {x_probe.shape[0] if x_probe.dim() else 0} examples and y_probe "
                f"{y_probe.shape[0]} labels; pass one label per example (at least one)"
            )
        self.model = model
        self.x, self.y = x_probe, y_probe.long()
        self.initial = (
            dict(initial_params)
            if initial_params is not None
            else {k: v.detach().clone() for k, v in model.named_parameters()}
        )
        self._seam: Seam | None = None
        self._names: list[str] | None = None
        self.inputs: tuple[str, ...] = ()
        self.classes = 0

    # -- structure ------------------------------------------------------------------------
    @property
    def seam(self) -> Seam:
        """The model's layers, discovered (once) in dense evaluation mode."""
        if self._seam is None:
            with read_only(self.model), torch.enable_grad():
                seam = discover(self.model, self.x)
                with seam.capture() as calls:
                    logits = self.model(self.x[:3])
            self.classes = int(logits.shape[1])
            if int(self.y.max()) >= self.classes or int(self.y.min()) < 0:
                raise FathomError(
                    f"y_probe holds labels outside 0 .. {self.classes - 1} (the model has "
                    f"{self.classes} logits); relabel or change the classifier"
                )
            self.inputs = tuple(
                layer.name
                for layer in seam.layers
                if calls[layer.name]
                and (a := _first(calls[layer.name][0].input_leaves())) is not None
                and a.requires_grad
            )
            self._seam = seam
        return self._seam

    @property
    def layers(self):
        return self.seam.layers

    def field_names(self) -> list[str]:
        """The names ``observe`` returns, in registry order (expanded once)."""
        if self._names is None:
            layers = [layer.name for layer in self.layers]
            self._names = expected_names(self.families, layers, (), self.classes, self.inputs)
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
    ) -> dict[str, float | None]:
        """Every selected family now; leaves every piece of state as found."""
        seam = self.seam
        fams = set(self.families)
        row: dict[str, Value] = {}
        with read_only(self.model), torch.enable_grad():
            if fams & set(PROBE_FAMILIES):
                row.update(self._probe(seam, fams))
            if "params" in fams:
                initial = self.initial if initial_params is None else initial_params
                row.update(self.param_fields(optimizer, initial))
        names = self._names if self._names is not None else self.field_names()
        return {name: row[name] for name in names}

    def _probe(self, seam: Seam, fams: set[str]) -> dict[str, Value]:
        row: dict[str, Value] = {}
        needs_delta = bool(fams & {"backprop", "gradients", "moments"})
        n = int(self.y.shape[0])
        with torch.set_grad_enabled(needs_delta), seam.capture() as calls:
            logits = self.model(self.x)
        y = self.y
        if "probe" in fams:
            losses = F.cross_entropy(logits.detach(), y, reduction="none").to(torch.float64)
            row["probe/ce"] = float(losses.mean())
            row["probe/acc"] = float((logits.detach().argmax(dim=1) == y).double().mean())
        if "activations" in fams:
            for name in self.inputs:
                row.update(_activation_row(name, calls[name], n))
        if not needs_delta:
            return row
        # delta_i = dL_i/dz_i: the gradient of the *summed* per-example CE w.r.t. each layer
        # output z; example i only reaches the rows of example i, so they are dL_i/dz_i.
        total = F.cross_entropy(logits, y, reduction="sum")
        cots = seam.cotangents(calls, total)
        if "backprop" in fams:
            for layer in seam.layers:
                row.update(_delta_row(layer.name, calls[layer.name], cots[layer.name], n))
        if fams & {"gradients", "moments"}:
            row.update(self._gradient_rows(seam, calls, cots, n, fams))
        return row

    def _gradient_rows(self, seam, calls, cots, n, fams) -> dict[str, Value]:
        row: dict[str, Value] = {}
        stats = {
            layer.name: gram_and_bias_mean(layer, calls[layer.name], cots[layer.name], n)
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
            if "moments" in fams:
                for key in _MOMENT_KEYS:
                    row[f"grad/pex/{key}/{layer.name}"] = None if mom is None else getattr(mom, key)
                values = quantiles.get(layer.name, [None] * (len(NORM_QUANTILES) + 1))
                for q, v in zip(NORM_QUANTILES, values, strict=False):
                    row[f"grad/pex/norm_{quantile_key(q)}/{layer.name}"] = v
                row[f"grad/pex/norm_max/{layer.name}"] = values[-1]
        return row

    def param_fields(
        self, optimizer: torch.optim.Optimizer | None, initial: Mapping[str, torch.Tensor]
    ) -> dict[str, Value]:
        """The ``params`` family: norms, displacement, momentum and update ratios per layer."""
        row: dict[str, Value] = {}
        for layer in self.layers:
            tensors = layer.tensors()
            qual = dict(zip(layer.params, layer.qualified, strict=True))
            ws = [(tensors[p], initial[qual[p]]) for p in layer.weights]
            w_norm = joint_norm([P.frob(w) for w, _ in ws])
            disp = joint_norm([P.displacement(w, w0) for w, w0 in ws])
            opt_norms = (
                [P.momentum_norm(w, optimizer) for w, _ in ws] if optimizer is not None else [None]
            )
            updates = (
                [P.sgd_last_update_norm(w, optimizer) for w, _ in ws]
                if optimizer is not None
                else [None]
            )
            name = layer.name
            row[f"param/weight_norm/{name}"] = w_norm
            row[f"param/bias_norm/{name}"] = joint_norm([P.frob(tensors[b]) for b in layer.biases])
            row[f"param/disp/{name}"] = disp
            row[f"param/disp_rel/{name}"] = P.ratio(disp, joint_norm([P.frob(w0) for _, w0 in ws]))
            row[f"param/momentum_norm/{name}"] = joint_norm(opt_norms)
            row[f"param/update_ratio/{name}"] = P.ratio(joint_norm(updates), w_norm)
        sq = 0.0
        for name, p in self.model.named_parameters():
            sq += P.displacement(p, initial[name]) ** 2
        row["param/disp_total"] = sq**0.5
        return row


def norm_quantiles(k: torch.Tensor) -> list[list[float]]:
    """Per layer of ``k`` (``[L, N, N]`` Grams): the :data:`NORM_QUANTILES` of the
    per-example norms ``||g_i|| = sqrt(K_ii)`` and their max, ``L`` lists of floats.

    Linear interpolation between order statistics (``torch.quantile``'s default): with sorted
    ``x_(0) <= ... <= x_(N-1)`` and ``p = q (N - 1)``,
    ``Q(q) = x_(floor p) + (p - floor p) (x_(ceil p) - x_(floor p))``.
    """
    k = k.to("cpu", torch.float64)
    norms = torch.sort(torch.diagonal(k, dim1=1, dim2=2).clamp_min(0.0).sqrt(), dim=1).values
    pos = torch.tensor(NORM_QUANTILES, dtype=torch.float64) * (norms.shape[1] - 1)
    lo, hi = pos.floor().long(), pos.ceil().long()
    q = norms[:, lo] + (pos - lo.to(torch.float64)) * (norms[:, hi] - norms[:, lo])
    return torch.cat([q, norms[:, -1:]], dim=1).tolist()  # note: one host read for all layers


def _activation_row(name: str, calls: list[Call], n: int) -> dict[str, Value]:
    parts = []
    for call in calls:
        leaves = call.input_leaves()
        j = _first_index(leaves)
        if j is not None:
            parts.append(_per_example(leaves[j], call.in_dims[j], n))
    h = torch.cat(parts, dim=1) if parts else torch.empty(0)
    zeros = zero_fractions(h) if parts else {"zero_frac": None, "dead_frac": None}
    return {f"probe/act/{key}/{name}": v for key, v in {**entry_summary(h), **zeros}.items()}


def _delta_row(name: str, calls: list[Call], cots: list, n: int) -> dict[str, Value]:
    parts = []
    for call, cot in zip(calls, cots, strict=True):
        j = next((j for j, t in enumerate(cot) if t is not None), None)
        if j is not None:
            parts.append(_per_example(cot[j], call.out_dims[j], n))
    d = torch.cat(parts, dim=1) if parts else torch.empty(0)
    return {f"probe/delta/{key}/{name}": v for key, v in entry_summary(d).items()}
