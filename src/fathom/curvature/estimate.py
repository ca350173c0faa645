"""Curvature diagonals when exact is unaffordable: Monte-Carlo and Hutchinson, with standard errors.

The exact diagonals (:mod:`fathom.curvature.exact`) pull back every output direction of the
loss Hessian's square root, ``C - 1`` per example for softmax cross-entropy: their cost and
memory grow linearly in the number of classes. Two unbiased estimators avoid that, each
with a standard error; :func:`diagonals` picks among them and the exact path by a stated
:class:`Budget`.

Normalization as everywhere in :mod:`fathom.curvature`: a matrix is the **mean over the N
probe examples**, ``M = (1/N) sum_i J_i^T H_i J_i`` (``H_i`` the per-example output Hessian:
the softmax Hessian ``diag(p_i) - p_i p_i^T`` for the GGN, the identity for the logit-Jacobian
Gram).

**Monte-Carlo (``"mc"``).** For every example ``i`` and sample ``k = 1..K`` an output
direction ``v_ik`` is drawn independently with ``E[v v^T] = H_i`` (:data:`_SAMPLERS`: for
softmax cross-entropy ``v = p_i - e_yhat`` with ``yhat ~ Categorical(p_i)``, the sampled
Fisher; for the Jacobian Gram a Rademacher ``v``), pulled back through the seam exactly as the
exact path pulls back its directions (:func:`fathom.curvature.probe.pull_back`,
:func:`fathom.curvature.exact.layer_sums`: the same per-layer code), and squared::

    x_ik      = (J_i^T v_ik)^2                       (elementwise, every parameter)
    diag_mc   = (1/(N K)) sum_i sum_k x_ik           (E[diag_mc] = diag(M))

*Standard error.* The ``N K`` terms ``x_ik`` are independent, so ``Var(diag_mc) =
(1/(N^2 K)) sum_i Var(x_i)``, and with ``s_i^2 = (1/(K-1)) sum_k (x_ik - xbar_i)^2`` example
``i``'s sample variance over its ``K`` draws (``xbar_i`` their mean, ``K >= 2``)::

    SE^2(diag_mc) = (1/(N^2 K)) sum_i s_i^2 = sum_i sum_k (x_ik - xbar_i)^2 / (N^2 K (K - 1))

is unbiased for it, whatever the chunk layout. The same formula on the per-draw traces
``T_ik = sum_j x_ik[j]`` (one parameter's entries, or every parameter's) gives the traces'
standard errors (entries of one draw are correlated, so a trace's SE is not the root-sum of
its entries' SEs). Every sum is read off the per-example rows of the same pullback
(:class:`_SampledPlan`): for a linear layer ``x_ik[o, j] = u_iko^2 a_ij^2`` and the draws
enter through ``u`` only, so ``sum_i sum_k (x_ik - xbar_i)^2 = sum_i c_io a_ij^4`` with
``c_io = sum_k (u_iko^2 - mean_k u_iko^2)^2``: one ``[O, N] @ [N, I]`` product besides the
estimate's, never a per-draw copy of the parameters. Memory is bounded by chunking over
examples **and** samples (a group of samples is pulled back at a time; when one example's
draws need several groups, a chunk is that one example and its groups' spreads combine by
Chan's formula).

**Hutchinson (``"hutchinson"``).** ``diag(M) = E[z * (M z)]`` for a Rademacher ``z`` in
parameter space (``E[z z^T] = I``): per sample ``k`` one GGN-vector product ``M z_k =
(1/N) sum_i J_i^T H_i (J_i z_k)``, the Jacobian-vector product ``J z`` by the double-vjp
(``J z = d<J^T u, z>/du``), the output Hessian applied in closed form, then one vjp; its
estimate ``d_k = z_k * (M z_k)`` and ``diag_h = (1/K) sum_k d_k`` with
``SE^2 = s^2 / K`` (``s^2`` the sample variance over ``k`` per entry; for the trace
``t_k = z_k^T M z_k``). It needs no output directions at all (memory of a few gradients), but
its variance per entry is ``sum_{j' != j} M_jj'^2``: off-diagonal mass, not the number of
classes.

**Another loss** is one row of :data:`_SAMPLERS` (its ``mc_directions(output, target, k,
generator)``, ``E[v v^T]`` its per-example output Hessian: :func:`mse_samples` and
:func:`bce_samples` are written for that) and one of :data:`_HESSIAN_PRODUCTS` (Hutchinson).
Directions that already carry the loss's weights ``sqrt(w)`` (``w = 1/M`` over the valid
positions of a mean reduction) are summed, not averaged over the ``N`` examples: then the
``1/N`` of :func:`mc_diagonals` is replaced by one.

**Every result says its estimator, samples and seed** (:meth:`Estimate.record`); the draws
follow ``torch.Generator().manual_seed(seed)`` in the order of the chunks, which the record
states. The empirical Fisher has one direction per example (one gradient's cost): it is
always exact.
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from fathom.curvature.exact import (
    _ELEMENTS,
    Diagonals,
    Plan,
    exact_diagonals,
    layer_sums,
    resolve_families,
    single_row,
)
from fathom.curvature.probe import probe_labels, pull_back
from fathom.curvature.twin import prepared
from fathom.errors import FathomError, with_suggestion
from fathom.seam import Seam
from fathom.seam.discovery import is_float_tensor
from fathom.train.allocator import tune_cpu_allocator

_ESTIMATORS: tuple[str, ...] = ("exact", "mc", "hutchinson", "auto")
Estimator = Literal["exact", "mc", "hutchinson"]
_SAMPLED: tuple[str, ...] = ("ggn", "jacobian_gram")  # families an estimator can sample
_BYTES = 8  # float64

Sampler = Callable[[torch.Tensor, torch.Tensor, int, torch.Generator], torch.Tensor]
"""``sampler(output, target, k, generator) -> [k, N, *out_shape]``: ``k`` output directions
per example, independent over examples and draws, with ``E[v v^T]`` the per-example output
Hessian (weight one per example; the ``1/N`` of the mean is applied by the caller)."""


# -- output-space samplers: E[v v^T] = H -----------------------------------------------------
def softmax_ce_samples(
    logits: torch.Tensor, labels: torch.Tensor, k: int, generator: torch.Generator
) -> torch.Tensor:
    """``v = p - e_yhat``, ``yhat ~ Categorical(p)`` per example and draw, ``[k, N, C]``.

    ``E[v v^T] = sum_c p_c (p - e_c)(p - e_c)^T = p p^T - 2 p p^T + diag(p) = diag(p) - p p^T``,
    the softmax Hessian of cross-entropy over the logits (``labels`` are not used: the model's
    own predictive distribution is sampled, as for the Fisher = GGN identity of an
    exponential family). ``p`` is ``torch.softmax``'s, ``O(N C)``: the complement logits of
    :mod:`fathom.curvature.softmax` cost ``O(N C^2)``, and a sampled direction needs no
    cancellation-free ``1 - p`` (its rounding, ``eps``, is far below the sampling noise)."""
    p = torch.softmax(logits, -1)
    draws = torch.multinomial(p.cpu(), k, replacement=True, generator=generator).to(p.device)
    v = p[None].expand(k, *p.shape).clone()
    rows = torch.arange(p.shape[0], device=p.device)
    v[torch.arange(k, device=p.device)[:, None], rows[None, :], draws.T] -= 1.0
    return v


def mse_samples(
    output: torch.Tensor, target: torch.Tensor, k: int, generator: torch.Generator
) -> torch.Tensor:
    """``v = sqrt(2) eps``, ``eps ~ N(0, I)``, ``[k, *output.shape]``: ``E[v v^T] = 2 I``, the
    Hessian of ``torch.nn.functional.mse_loss(reduction="sum")`` per entry (``(o - t)^2``,
    second derivative 2; ``"mean"`` divides by the entry count, the caller's weight)."""
    eps = torch.randn((k, *output.shape), generator=generator, dtype=output.dtype)
    return math.sqrt(2.0) * eps.to(output.device)


def bce_samples(
    output: torch.Tensor, target: torch.Tensor, k: int, generator: torch.Generator
) -> torch.Tensor:
    """``v = sigmoid(o) - b``, ``b ~ Bernoulli(sigmoid(o))`` per entry, ``[k, *output.shape]``:
    ``E[v^2] = s(1 - s)``, the Hessian of ``binary_cross_entropy_with_logits`` per entry
    (entries independent, so the off-diagonal expectations vanish)."""
    s = torch.sigmoid(output)
    b = torch.bernoulli(s[None].expand(k, *s.shape).contiguous(), generator=generator)
    return s[None] - b


def _rademacher_samples(
    output: torch.Tensor, target: torch.Tensor, k: int, generator: torch.Generator
) -> torch.Tensor:
    """``v`` with independent ``+-1`` entries, ``[k, *output.shape]``: ``E[v v^T] = I`` (the
    logit-Jacobian Gram's output matrix)."""
    signs = torch.randint(0, 2, (k, *output.shape), generator=generator, device="cpu")
    return (2.0 * signs - 1.0).to(dtype=output.dtype, device=output.device)


_SAMPLERS: dict[str, Sampler] = {"ggn": softmax_ce_samples, "jacobian_gram": _rademacher_samples}


def _softmax_hessian_product(logits: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``H v = p * v - p (p . v)`` per example (``H = diag(p) - p p^T``), ``[N, C]``."""
    p = torch.softmax(logits, -1)
    return p * v - p * (p * v).sum(-1, keepdim=True)


_HESSIAN_PRODUCTS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "ggn": _softmax_hessian_product,
    "jacobian_gram": lambda logits, v: v,
}


# -- the budget and the cost model -------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "kb": 2**10, "mb": 2**20, "gb": 2**30, "kib": 2**10, "mib": 2**20}
_UNITS |= {"gib": 2**30, "tb": 2**40, "tib": 2**40}


def _parse_bytes(text: str | int | float) -> int:
    """``"4GB"``, ``"512 MiB"`` or a number of bytes -> bytes (binary units: 1 GB = 2**30)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return int(text)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise FathomError(
            f"memory budget {text!r} is not a size: write bytes or a number with a unit, "
            "e.g. '4GB' or '512MiB'"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass(frozen=True)
class Budget:
    """What ``estimator="auto"`` may spend: ``memory`` (bytes, or text like ``"4GB"``) for the
    pulled-back directions and per-example rows of one chunk, and ``backward_passes``, the time
    as output directions pulled back per example (one direction over the probe costs about
    one backward pass; the exact GGN needs ``C - 1`` of them, MC ``K``)."""

    memory: int | str = "4GB"
    backward_passes: int = 2048

    @property
    def memory_bytes(self) -> int:
        return _parse_bytes(self.memory)


@dataclass(frozen=True)
class Costs:
    """What one (direction, example) costs, measured on one example (:func:`measure`):
    ``largest`` parameters of the largest layer whose per-example rows are materialized
    (the cost model of :func:`fathom.curvature.exact.exact_diagonals`' chunks),
    ``activations`` float elements of every layer output (each gets a cotangent per
    direction), ``parameters`` in all, ``classes`` the output width."""

    largest: int
    activations: int
    parameters: int
    classes: int

    @property
    def per_row(self) -> int:
        """Float64 elements one (direction, example) pair holds: its cotangents plus the
        materialized rows and their squares (2x the largest layer)."""
        return self.activations + 2 * self.largest

    def exact_bytes(self, plan: Plan, n: int, width: int | None = None) -> int:
        """Exact diagonals' peak on ``n`` examples: ``width x chunk x per_row`` with exact.py's
        chunk rule (as many examples as keep ``width x chunk x largest`` within its element
        bound, at least one: the directions are never split). ``width``: the rows per example
        when the output is not ``[N, C]`` (default ``plan.width(classes)``)."""
        width = plan.width(self.classes) if width is None else width
        chunk = min(n, max(1, _ELEMENTS // max(1, width * self.largest)))
        return _BYTES * (width * chunk * self.per_row + 2 * self.parameters)

    def mc_bytes(self) -> int:
        """MC's least peak: one direction of one example per chunk."""
        return _BYTES * (self.per_row + 4 * self.parameters)

    def hutchinson_bytes(self) -> int:
        """Hutchinson's least peak (one example per chunk): ``z``, ``M z``, the running mean and
        variance, the double-vjp's gradient graph (~3 parameter copies) and ~3 activation copies."""
        return _BYTES * (7 * self.parameters + 3 * self.activations)


_MEASURED: weakref.WeakKeyDictionary[Seam, tuple[tuple, Costs]] = weakref.WeakKeyDictionary()


def measure(seam: Seam, x: torch.Tensor, plan: Plan) -> Costs:
    """:class:`Costs` from one captured forward of one example, kept per seam and example
    shape (a seam is cached per model structure and input signature:
    :mod:`fathom.curvature.twin`; the sizes it measures depend on nothing else)."""
    key = (tuple(x.shape[1:]), x.dtype, x.device)
    hit = _MEASURED.get(seam)
    if hit is not None and hit[0] == key:
        return hit[1]
    costs = _measure(seam, x)
    _MEASURED[seam] = (key, costs)
    return costs


def _measure(seam: Seam, x: torch.Tensor) -> Costs:
    with seam.capture() as calls, torch.no_grad():
        out = seam.model(x[:1])
    largest = max(
        (
            sum(t.numel() for t in layer.tensors().values())
            for layer in seam.layers
            if not single_row(layer, calls[layer.name])
        ),
        default=0,
    )
    acts = sum(
        t.numel()
        for layer_calls in calls.values()
        for call in layer_calls
        for t in call.output_leaves()
        if is_float_tensor(t)
    )
    params = sum(p.numel() for p in seam.model.parameters())
    return Costs(largest, acts, params, int(out.shape[1]) if out.dim() > 1 else 1)


def _gib(b: int) -> str:
    return f"{b / 2**30:.3g} GiB"


def choose(
    costs: Costs, plan: Plan, samples: int, budget: Budget, n: int, width: int | None = None
) -> tuple[Estimator, str]:
    """``(estimator, why)``: exact when its memory and time fit ``budget``, else MC; a
    :class:`FathomError` naming the fix when neither fits. ``width``: the exact path's
    directions per example when the output is not ``[N, C]``
    (:func:`fathom.curvature.families.total_directions`; default ``plan.width(classes)``).

    Hutchinson is never chosen: its least memory (:meth:`Costs.hutchinson_bytes`, about 7
    parameter copies) is above MC's (one direction of one example, 4 copies and the largest
    layer's rows twice) for every model, and its variance grows with the off-diagonal mass of
    the matrix; it is there on request (an independent check of MC, or a model whose
    per-example rows a custom layer cannot give)."""
    mem = budget.memory_bytes
    width = plan.width(costs.classes) if width is None else width
    exact_b = costs.exact_bytes(plan, n, width)
    if exact_b <= mem and width <= budget.backward_passes:
        return "exact", (
            f"exact fits the budget: ~{_gib(exact_b)} <= {_gib(mem)} and {width} directions "
            f"per example <= {budget.backward_passes} backward passes"
        )
    over = (
        f"exact needs ~{_gib(exact_b)} (budget {_gib(mem)}) and {width} directions per example "
        f"(budget {budget.backward_passes})"
    )
    sampled = samples * sum(f in _SAMPLED for f in plan.families)
    if costs.mc_bytes() <= mem and sampled <= budget.backward_passes:
        return "mc", f"{over}: Monte-Carlo with {samples} samples per example fits"
    raise FathomError(
        f"no curvature estimator fits the budget ({_gib(mem)}, {budget.backward_passes} "
        f"backward passes): {over}, Monte-Carlo at least ~{_gib(costs.mc_bytes())} (one "
        f"direction of one example at a time) and {sampled} passes; raise the budget (e.g. "
        f"budget=Budget(memory='{math.ceil(costs.mc_bytes() / 2**30)}GB')), use fewer "
        "samples, or a smaller model"
    )


# -- running variance over samples (Chan et al.'s parallel combination) -------------------------
@dataclass
class _Moments:
    """Count, mean and sum of squared deviations of a stream of tensors, combined by groups."""

    count: int = 0
    mean: torch.Tensor | float = 0.0
    m2: torch.Tensor | float = 0.0

    def add(self, group: torch.Tensor) -> None:
        """Fold in ``group [k, ...]`` (``k`` new observations)."""
        k = group.shape[0]
        g_mean = group.mean(0)
        g_m2 = (group - g_mean).square_().sum(0)  # (torch.var_mean over dim 0 is 20x slower)
        if self.count == 0:
            self.count, self.mean, self.m2 = k, g_mean, g_m2
            return
        total = self.count + k
        delta = g_mean - self.mean
        self.mean = self.mean + delta * (k / total)
        self.m2 = self.m2 + g_m2 + delta.square() * (self.count * k / total)
        self.count = total

    @property
    def variance(self) -> torch.Tensor | float:
        """The unbiased sample variance (``count >= 2``)."""
        return self.m2 / (self.count - 1)


# -- the result --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """Diagonals ``{family: {param: tensor}}`` with their standard errors and how they were made.

    ``standard_errors[f]`` (entries) and ``trace_standard_errors[f]`` are ``None`` for an
    exact family; ``traces[f]`` sums the family's diagonal over every parameter (weights and
    biases); ``parameter_traces[f][name]`` per parameter, with ``parameter_trace_standard_errors``.
    """

    diagonals: Diagonals
    standard_errors: dict[str, dict[str, torch.Tensor] | None]
    traces: dict[str, float]
    trace_standard_errors: dict[str, float | None]
    parameter_traces: dict[str, dict[str, float]]
    parameter_trace_standard_errors: dict[str, dict[str, float] | None]
    estimators: dict[str, str]
    samples: int | None
    seed: int | None
    choice: str
    layout: dict = field(default_factory=dict)

    def record(self) -> dict:
        """JSON-ready: estimator per family, samples, seed, why, chunk layout, traces and SEs."""
        return {
            "estimator": dict(self.estimators),
            "samples": self.samples,
            "seed": self.seed,
            "choice": self.choice,
            "layout": dict(self.layout),
            "traces": dict(self.traces),
            "trace_standard_errors": dict(self.trace_standard_errors),
            "parameter_traces": {k: dict(v) for k, v in self.parameter_traces.items()},
            "parameter_trace_standard_errors": {
                k: None if v is None else dict(v)
                for k, v in self.parameter_trace_standard_errors.items()
            },
            "standard_error_formula": _STANDARD_ERROR_FORMULAS,
        }


_STANDARD_ERROR_FORMULAS: dict[str, str] = {
    "exact": "none (exact up to float64 rounding)",
    "mc": "SE^2 = (1/(N^2 K)) sum_i s_i^2, s_i^2 the sample variance over example i's K "
    "draws of x_ik = (J_i^T v_ik)^2; traces the same on the per-draw traces sum_j x_ik[j]",
    "hutchinson": "SE^2 = s^2 / K, s^2 the sample variance over the K Rademacher draws of "
    "z_k * (M z_k) (traces: of z_k^T M z_k)",
}


# -- Monte-Carlo -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _SampledPlan:
    """A :class:`fathom.curvature.exact.Plan` look-alike for ``draws`` sampled directions per
    family (pulled back together, family after family): :func:`fathom.curvature.exact.layer_sums`
    returns per family ``(f, "sum")``, ``sum_i sum_k x_ik``, and with ``spread`` also
    ``(f, "m2")``, ``sum_i sum_k (x_ik - xbar_i)^2`` (``xbar_i`` example ``i``'s mean over its
    draws), and ``(f, "traces")``, the per-example per-draw traces ``sum_j x_ik[j]`` ``[N, K]``:
    every statistic the standard errors need, read off the per-example rows in the same pass."""

    families: tuple[str, ...]
    draws: int
    spread: bool = True
    scale: float = 1.0  # applied to the sums (the estimate's 1/(N K))
    se_scale: float = 1.0  # applied to the spreads (SE^2's 1/(N^2 K (K - 1)))
    units: bool = False

    def rows(self, r: torch.Tensor, dirs: object) -> dict[str, torch.Tensor]:
        k = self.draws
        return {f: r[:, j * k : (j + 1) * k] for j, f in enumerate(self.families)}

    def squares(self, kind: str, sq: torch.Tensor, place=None, examples=None) -> dict:
        """The statistics of ``x = sq [G, K, *entries]`` (:func:`fathom.curvature.exact._squares`)."""
        s1 = sq.sum(1)  # [G, *entries]
        out = {(kind, "sum"): (s1.sum(0) if place is None else place(s1)).mul_(self.scale)}
        if self.spread:
            traces = sq.sum(tuple(range(2, sq.dim()))) if sq.dim() > 2 else sq.clone()  # [G, K]
            out[kind, "traces"] = traces if examples is None else examples(traces)
            # centred in place (``sq`` is scratch): no second [G, K, *entries] buffer
            m2 = sq.sub_((s1 / sq.shape[1]).unsqueeze(1)).square_().sum(1)
            out[kind, "m2"] = (m2.sum(0) if place is None else place(m2)).mul_(self.se_scale)
        return out

    def factored(self, kind: str, q: torch.Tensor, b: torch.Tensor) -> tuple[dict, dict]:
        """``(weight, bias)`` statistics of ``x_ik[o, j] = q[i, k, o] b[i, j]`` (a linear layer:
        ``q = u^2`` the squared output cotangents, ``b = a^2`` the squared inputs): the draws
        enter through ``q`` only, so ``x_ik - xbar_i = (q_ik - qbar_i) b_i`` and every sum is
        one ``[O, N] @ [N, I]`` product, never ``[N, K, O, I]`` (the scales applied to the
        ``[N, O]`` factor, not to the ``[O, I]`` result)."""
        qs = q.sum(1)  # [N, O]
        w, bias = {(kind, "sum"): (qs * self.scale).T @ b}, {(kind, "sum"): qs.sum(0) * self.scale}
        if self.spread:
            c = (q - (qs / q.shape[1])[:, None]).square_().sum(1).mul_(self.se_scale)  # [N, O]
            w[kind, "m2"] = c.T @ b.square()
            bias[kind, "m2"] = c.sum(0)
            qt = q.sum(2)  # [N, K]
            w[kind, "traces"] = qt * b.sum(1, keepdim=True)
            bias[kind, "traces"] = qt
        return w, bias

    def join(self, label: tuple[str, str], parts: list[torch.Tensor], shape) -> torch.Tensor:
        if label[1] == "traces":
            return sum(parts[1:], parts[0])
        return torch.cat([p.reshape(-1) for p in parts]).reshape(shape)


def _groups(total: int, size: int) -> Iterable[tuple[int, int]]:
    for start in range(0, total, size):
        yield start, min(size, total - start)


def _centred(t: torch.Tensor) -> float:
    """``sum_i sum_k (t_ik - tbar_i)^2`` of per-example per-draw values ``t [N, K]``."""
    return float((t - t.mean(1, keepdim=True)).square_().sum())


def mc_diagonals(
    seam: Seam,
    x: torch.Tensor,
    labels: torch.Tensor,
    *,
    samplers: dict[str, Sampler],
    samples: int,
    generator: torch.Generator,
    examples_per_chunk: int,
    samples_per_chunk: int,
    standard_errors: bool = True,
) -> tuple[dict, dict, dict, dict]:
    """Monte-Carlo diagonals of the families in ``samplers`` (module docstring).

    One forward and one batched pullback per chunk of examples (and group of samples): the
    estimate's sums ``sum_i sum_k x_ik`` and, for the standard errors, the per-example
    spreads ``sum_k (x_ik - xbar_i)^2`` and per-draw traces are all read off the same
    per-example rows (:class:`_SampledPlan`). ``standard_errors=False`` skips the spreads:
    the same estimate (bit for bit: the same draws, the same sums), its standard errors
    ``None``. When one example's ``samples`` do not fit (``samples_per_chunk < samples``) the
    chunks hold one example each and its groups of draws combine by Chan's formula.

    Returns ``(diag, se, param_trace_reps, trace_reps)``: per family ``{param: estimate}``,
    ``{param: standard error}`` and, for the traces, per family ``{param: (estimate, SE)}`` and
    ``(estimate, SE)`` of the total. ``samplers[f](output, target, k, generator)`` gives the
    directions (:data:`Sampler`); wiring another loss in is one entry of that table."""
    n = x.shape[0]
    names = dict(seam.model.named_parameters())
    fams = tuple(samplers)
    if standard_errors and samples < 2:
        raise FathomError(
            f"samples={samples}: a standard error needs at least 2 draws per example; pass "
            "samples=2 or more, or standard_errors=False"
        )
    scale = 1.0 / (n * samples)
    se_scale = 1.0 / (n * n * samples * (samples - 1)) if standard_errors else 1.0
    split = samples_per_chunk < samples
    examples_per_chunk = 1 if split else examples_per_chunk
    total: dict = {f: {} for f in fams}
    m2: dict = {f: {} for f in fams}
    tm2 = {f: dict.fromkeys(names, 0.0) for f in fams}
    tsum = {f: dict.fromkeys(names, 0.0) for f in fams}
    tm2_all = dict.fromkeys(fams, 0.0)
    for start in range(0, n, examples_per_chunk):
        xc, yc = x[start : start + examples_per_chunk], labels[start : start + examples_per_chunk]
        nc = len(xc)
        chunk: dict = {f: {} for f in fams}  # param -> [count, sum, m2] over this chunk's groups
        traces: dict = {f: {p: [] for p in names} for f in fams}  # per-draw traces [nc, k]
        for _, k in _groups(samples, samples_per_chunk):
            plan = _SampledPlan(fams, k, standard_errors, scale, se_scale)

            def directions(z, yc=yc, k=k):
                return torch.cat([samplers[f](z, yc, k, generator) for f in fams])

            pb = pull_back(seam, xc, directions)
            group: dict = {f: {} for f in fams}  # param -> [sum, m2, traces] of this group
            for layer in seam.layers:
                with torch.no_grad():  # (torch.func's vjp of a generic layer keeps its own)
                    sums = layer_sums(
                        layer, pb.calls[layer.name], pb.cotangents[layer.name], nc, None, plan
                    )
                for local, qualified in zip(layer.params, layer.qualified, strict=True):
                    got = sums[local]
                    for f in fams:
                        new = [  # (a generic layer's sums may carry a graph: dropped)
                            None if t is None else t.detach()
                            for t in (got[f, "sum"], got.get((f, "m2")), got.get((f, "traces")))
                        ]
                        if qualified in group[f]:  # a second layer reaching the parameter
                            old = group[f][qualified]
                            new = [a if b is None else a + b for a, b in zip(new, old)]
                        group[f][qualified] = new
            for f in fams:
                for p, (s, v, t) in group[f].items():
                    _fold(chunk[f], p, k, s, v, samples / max(1, samples - 1))
                    if t is not None:
                        traces[f][p].append(t)
        for f in fams:
            for p, (_, s, v) in chunk[f].items():
                total[f][p] = total[f][p] + s if p in total[f] else s
                if standard_errors:
                    m2[f][p] = m2[f][p] + v if p in m2[f] else v
            if not standard_errors:
                continue
            per_draw = 0.0
            for p in names:
                if traces[f][p]:  # a parameter no layer reached (unused) has none
                    t = torch.cat(traces[f][p], 1)  # [nc, K]: the groups' draws side by side
                    tm2[f][p] += _centred(t)
                    tsum[f][p] += float(t.sum())
                    per_draw = per_draw + t
            if isinstance(per_draw, torch.Tensor):
                tm2_all[f] += _centred(per_draw)
    diag = {  # a parameter no layer reached (unused) is zero
        f: {
            p: total[f][p] if p in total[f] else torch.zeros_like(t).detach()
            for p, t in names.items()
        }
        for f in fams
    }
    if not standard_errors:
        return diag, {}, {}, {}
    se = {
        f: {
            p: _sqrt_(m2[f][p]) if p in m2[f] else torch.zeros_like(t).detach()
            for p, t in names.items()
        }
        for f in fams
    }
    ptr = {  # each parameter's trace from its per-draw traces (the diagonal's sum, up to
        # float64 rounding: no pass over the parameters)
        f: {p: (tsum[f][p] * scale, math.sqrt(tm2[f][p] * se_scale)) for p in names}
        for f in fams
    }
    tr = {f: (sum(v for v, _ in ptr[f].values()), math.sqrt(tm2_all[f] * se_scale)) for f in fams}
    return diag, se, ptr, tr


def _sqrt_(t: torch.Tensor) -> torch.Tensor:
    """``t.sqrt_()``, on the CPU by numpy's correctly rounded IEEE square root: torch's CPU
    kernel is several times slower on zeros (dead ReLU units make whole rows of a standard
    error zero) and may be one unit in the last place off."""
    if t.device.type != "cpu" or not t.is_contiguous():
        return t.sqrt_()
    np.sqrt(t.numpy(), out=t.numpy())
    return t


def _fold(
    acc: dict, p: str, k: int, s: torch.Tensor, m2: torch.Tensor | None, ratio: float
) -> None:
    """Combine a group of ``k`` draws of one chunk (their scaled sum ``s`` and, with standard
    errors, their scaled per-example spread ``m2``) into ``acc[p] = [count, sum, m2]``; a
    later group (of the chunk's single example) by Chan's formula ``M2 = M2_a + M2_b +
    (mean_b - mean_a)^2 k_a k_b / (k_a + k_b)``, exact for the pooled draws. With the sums
    scaled by ``1/(N K)`` and the spreads by ``1/(N^2 K (K - 1))``, the last term is
    ``ratio = K / (K - 1)`` times the squared difference of the scaled means."""
    if p not in acc:
        acc[p] = [k, s, m2]
        return
    count, s0, v0 = acc[p]
    if m2 is not None:
        delta = s / k - s0 / count
        v0 = v0 + m2 + delta.square() * (ratio * count * k / (count + k))
    acc[p] = [count + k, s0 + s, v0]


def _mc_chunks(costs: Costs, families: int, samples: int, n: int, memory: int) -> tuple[int, int]:
    """``(examples, samples)`` per chunk: all ``samples`` at once and as many examples as fit
    half the memory budget (the other half for the model and the accumulators), never more
    than exact.py's element bound on materialized rows; fewer samples per group when one
    example with all of them does not fit."""
    cap = max(1, min(memory // (2 * _BYTES * costs.per_row), _ELEMENTS // max(1, costs.largest)))
    per_sample = families * 1
    k = max(1, min(samples, cap // per_sample))
    return max(1, min(n, cap // (per_sample * k))), k


# -- Hutchinson --------------------------------------------------------------------------------
def ggn_vector_product(
    model: nn.Module,
    params: list[torch.Tensor],
    x: torch.Tensor,
    hessian_product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    z: list[torch.Tensor],
) -> list[torch.Tensor]:
    """``sum_i J_i^T H_i J_i z`` over the examples of ``x`` (not yet / N), step by step.

    Attention runs on the math kernel of ``scaled_dot_product_attention`` (the fused CPU
    kernels have no second derivative); an operation without one is refused by name
    (:class:`FathomError`, pointing to ``estimator="mc"``)."""
    try:
        with sdpa_kernel(SDPBackend.MATH):
            return _ggn_vector_product(model, params, x, hessian_product, z)
    except (RuntimeError, NotImplementedError) as err:
        if "derivative" not in str(err) and "not implemented" not in str(err):
            raise
        raise FathomError(
            "Hutchinson needs a Jacobian-vector product, taken by differentiating the "
            f"backward pass, and torch cannot differentiate one of this model's: {err}. "
            "Use estimator='mc' (or 'exact'), which need first derivatives only"
        ) from None


def _ggn_vector_product(model, params, x, hessian_product, z) -> list[torch.Tensor]:
    with torch.enable_grad():
        out = model(x)
        # Apply the Jacobian of f onto z: z -> Jz (the double-vjp: J z = d<J^T u, z>/du at any u)
        u = torch.zeros_like(out, requires_grad=True)
        jtu = torch.autograd.grad(out, params, u, create_graph=True, allow_unused=True)
        used = [(g, zi) for g, zi in zip(jtu, z, strict=True) if g is not None]
        if not used:
            return [torch.zeros_like(p) for p in params]
        jz = torch.autograd.grad([g for g, _ in used], u, [zi for _, zi in used])[0]
        # Apply the output Hessian: Jz -> HJz (closed form per example)
        hjz = hessian_product(out.detach(), jz)
        # Apply the transposed Jacobian: HJz -> J^T H J z
        back = torch.autograd.grad(out, params, hjz, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, back)]


def _hutchinson_diagonals(
    seam: Seam,
    x: torch.Tensor,
    *,
    families: Iterable[str],
    samples: int,
    generator: torch.Generator,
    examples_per_chunk: int,
) -> tuple[dict, dict, dict, dict]:
    """Hutchinson diagonals ``(1/K) sum_k z_k * (M z_k)`` (module docstring); returns as
    :func:`mc_diagonals`."""
    model = seam.model
    named = dict(model.named_parameters())
    names, params = list(named), list(named.values())
    n = x.shape[0]
    out_d, out_se, out_ptr, out_tr = {}, {}, {}, {}
    for f in families:
        entry = {p: _Moments() for p in names}
        ptrace = {p: _Moments() for p in names}
        trace = _Moments()
        for _ in range(samples):
            z = [
                (2.0 * torch.randint(0, 2, p.shape, generator=generator) - 1.0).to(p)
                for p in params
            ]
            mz = [torch.zeros_like(p).detach() for p in params]
            for start in range(0, n, examples_per_chunk):
                part = ggn_vector_product(
                    model, params, x[start : start + examples_per_chunk], _HESSIAN_PRODUCTS[f], z
                )
                for acc, g in zip(mz, part, strict=True):
                    acc += g
            t_all = 0.0
            for name, zi, m in zip(names, z, mz, strict=True):
                d = zi * m / n
                entry[name].add(d[None])
                ptrace[name].add(d.sum()[None])
                t_all = t_all + d.sum()
            trace.add(torch.as_tensor(t_all)[None])
        out_d[f] = {p: entry[p].mean for p in names}
        out_se[f] = {p: (entry[p].variance / samples).sqrt() for p in names}
        out_ptr[f] = {
            p: (float(ptrace[p].mean), math.sqrt(float(ptrace[p].variance) / samples))
            for p in names
        }
        out_tr[f] = (float(trace.mean), math.sqrt(float(trace.variance) / samples))
    return out_d, out_se, out_ptr, out_tr


# -- the public entry point --------------------------------------------------------------------
def resolve_estimator(name: object) -> str:
    """``name`` if it is one of :data:`_ESTIMATORS`, else a :class:`FathomError` with a suggestion."""
    if isinstance(name, str) and name in _ESTIMATORS:
        return name
    raise FathomError(
        with_suggestion(
            f"unknown curvature estimator {name!r}: choose from {', '.join(_ESTIMATORS)}",
            str(name),
            _ESTIMATORS,
        )
    )


def _check_arguments(name: str, budget: object, samples: object, seed: object) -> None:
    if not isinstance(budget, Budget):
        raise FathomError(
            f"budget must be a fathom.curvature.Budget, got {type(budget).__name__}: "
            "e.g. budget=Budget(memory='4GB')"
        )
    budget.memory_bytes  # noqa: B018 - a size that does not parse is refused here, with the fix
    if name != "exact" and (
        isinstance(samples, bool) or not isinstance(samples, int) or samples < 2
    ):
        raise FathomError(
            f"samples={samples!r}: an estimator needs at least 2 samples per example (the "
            "standard error is a sample variance over them); pass samples=2 or more"
        )
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise FathomError(f"seed must be an integer, got {seed!r}")


def diagonals(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    families: str | Iterable[str] = "ggn",
    estimator: str = "auto",
    samples: int = 8,
    seed: int = 0,
    budget: Budget | None = None,
    standard_errors: bool = True,
) -> Estimate:
    """Float64 curvature diagonals of ``model`` on ``(x, y)`` by the chosen ``estimator``.

    ``families`` as :func:`fathom.curvature.exact.exact_diagonals` (default the GGN alone);
    ``estimator``: ``"exact"`` (:func:`~fathom.curvature.exact.exact_diagonals`), ``"mc"``,
    ``"hutchinson"`` (module docstring; ``samples = K >= 2`` draws per example, or per probe
    for Hutchinson, from ``torch.Generator().manual_seed(seed)``) or ``"auto"``: exact
    whenever its estimated memory and time fit ``budget`` (:class:`Budget`, default 4 GiB and
    2048 backward passes; cost model :class:`Costs`), otherwise MC (:func:`choose`); what
    it chose and why is :attr:`Estimate.choice`. The empirical Fisher is always exact. The MC
    path chunks over examples and over samples to stay within ``budget.memory``.
    ``standard_errors=False`` (MC only) skips the per-example spreads the standard errors
    need (for a linear layer one more ``[O, N] @ [N, I]`` product and a square root per
    entry): the same estimate, bit for bit, from the same draws, its standard errors ``None``.
    """
    tune_cpu_allocator()
    name = resolve_estimator(estimator)
    plan = Plan(resolve_families(families))
    budget = budget if budget is not None else Budget()
    _check_arguments(name, budget, samples, seed)
    _, x64, seam = prepared(model, x)
    n = x64.shape[0]
    costs = measure(seam, x64, plan)
    labels = probe_labels(y.to(x64.device) if isinstance(y, torch.Tensor) else y, n, costs.classes)
    if name == "auto":
        name, why = choose(costs, plan, samples, budget, n)
        choice = f"auto chose {name}: {why}"
    else:
        choice = f"{name} requested"
    sampled = [f for f in plan.families if f in _SAMPLED] if name != "exact" else []
    exact_fams = [f for f in plan.families if f not in sampled]
    exact = exact_diagonals(model, x, y, families=exact_fams) if exact_fams else {}
    generator = torch.Generator().manual_seed(seed)
    layout: dict = {}
    if sampled and name == "mc":
        ex, per = _mc_chunks(costs, len(sampled), samples, n, budget.memory_bytes)
        layout = {"examples_per_chunk": ex, "samples_per_chunk": per}
        layout["standard_errors"] = standard_errors
        est = mc_diagonals(
            seam,
            x64,
            labels,
            samplers={f: _SAMPLERS[f] for f in sampled},
            samples=samples,
            generator=generator,
            examples_per_chunk=ex,
            samples_per_chunk=per,
            standard_errors=standard_errors,
        )
    elif sampled:
        ex = max(1, min(n, budget.memory_bytes // (2 * _BYTES * 3 * max(1, costs.activations))))
        layout = {"examples_per_chunk": ex}
        est = _hutchinson_diagonals(
            seam, x64, families=sampled, samples=samples, generator=generator, examples_per_chunk=ex
        )
    else:
        est = ({}, {}, {}, {})
    diag, se, ptr, tr = est
    names = list(dict(seam.model.named_parameters()))
    values = Diagonals({f: (diag[f] if f in sampled else exact[f]) for f in plan.families})
    ptraces = {
        f: {p: v for p, (v, _) in ptr[f].items()}
        if f in ptr
        else {p: float(values[f][p].sum()) for p in names}
        for f in plan.families
    }
    return Estimate(
        diagonals=values,
        standard_errors={f: se.get(f) for f in plan.families},
        traces={f: sum(ptraces[f].values()) for f in plan.families},
        trace_standard_errors={f: tr[f][1] if f in tr else None for f in plan.families},
        parameter_traces=ptraces,
        parameter_trace_standard_errors={
            f: {p: s for p, (_, s) in ptr[f].items()} if f in ptr else None for f in plan.families
        },
        estimators={f: (name if f in sampled else "exact") for f in plan.families},
        samples=samples if sampled else None,
        seed=seed if sampled else None,
        choice=choice,
        layout=layout,
    )
