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
``t_k = z_k^T M z_k``). It needs no output directions at all (memory of a few gradients per
probe), but its variance per entry is ``sum_{j' != j} M_jj'^2``: off-diagonal mass, not the
number of classes. *Batched probes.* A pass applies ``M`` to up to :data:`_PROBES_PER_PASS`
probes at once (as many as the budget fits, :func:`_hutchinson_chunks`): one forward and one
double-vjp graph per chunk of examples, the probes' ``J z``, ``H J z`` and ``J^T H J z``
batched by autograd (``is_grads_batched``); they go one at a time on that graph where the
seam pulls back directions one at a time or the first pass finds torch's batching missing or
unequal to its first probe alone. The probes are drawn in the same order whatever the
passes, so every layout gives the one-at-a-time estimate to rounding (the record's
``probes_per_chunk`` and ``batched`` say which ran).

**Any loss, layout and reduction** (:func:`loss_diagonals`; :func:`diagonals` with
``loss=``, ``output=`` or ``class_dim=``). With the loss read on the output
(:class:`fathom.losses.Terms`: ``L = sum_i sum_p w_ip l_ip``, ``w_ip = s m_ip``) each family
is ``a sum_i sum_d (J_i^T v_id)^2`` (:mod:`fathom.curvature.families`). MC draws per example
``v_i = sqrt(N a) (m_ip u_ip)_p`` with ``u_ip`` drawn per position independently,
``E[u u^T] = H_ip`` (:data:`_POSITION_DRAWS`: the sampled Fisher for cross-entropy, scaled
by ``sqrt(sum_c t'_c)`` for probability targets; a Gaussian ``sqrt(2) eps`` per MSE entry,
so that ``E[v v^T]`` is exactly torch's ``mse_loss`` Hessian, ``2 w``; ``sigmoid(z) - b``,
``b ~ Bernoulli(sigmoid(z))``, per BCE entry; a Rademacher combination of the Hessian
factor's columns for any other :class:`~fathom.losses.Loss`), so that ``E[v_i v_i^T] =
N a sum_p m_ip H_ip`` and the ``1/N`` above leaves ``a``: the same estimator, standard
errors and chunks for every layout (positions of one example are drawn together, one
direction per draw). Hutchinson applies ``N a sum_p m_ip H_ip`` in closed form
(:data:`_POSITION_PRODUCTS`: ``O(C)`` per position for cross-entropy, never a ``[C, C]``
matrix). The language model's token loss (:mod:`fathom.curvature.language`) is this path.
Left unset, :func:`diagonals` reads ``[N, C]`` logits with integer labels (the rows of
:data:`_SAMPLERS` and :data:`_HESSIAN_PRODUCTS`), the same draws as ``loss="cross_entropy"``.

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
from fathom.curvature.families import FAMILIES, total_directions
from fathom.curvature.probe import probe_labels, pull_back
from fathom.curvature.twin import prepared
from fathom.errors import FathomError, with_suggestion
from fathom.losses.kinds import Loss, Terms, make_loss
from fathom.losses.layout import Selector
from fathom.seam import Seam
from fathom.seam.discovery import is_float_tensor
from fathom.seam.inputs import count, first_device, signature, take
from fathom.train.allocator import tune_cpu_allocator

_ESTIMATORS: tuple[str, ...] = ("exact", "mc", "hutchinson", "auto")
Estimator = Literal["exact", "mc", "hutchinson"]
_SAMPLED: tuple[str, ...] = ("ggn", "jacobian_gram")  # families an estimator can sample
_BYTES = 8  # float64

Sampler = Callable[[torch.Tensor, torch.Tensor, int, torch.Generator], torch.Tensor]
"""``sampler(output, target, k, generator) -> [k, N, *out_shape]``: ``k`` output directions
per example, independent over examples and draws, with ``E[v v^T]`` the per-example output
Hessian (weight one per example; the ``1/N`` of the mean is applied by the caller)."""

HessianProduct = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""``product(output, v, start) -> H v``, ``[n, *out]``: the output Hessian applied per example
to ``v`` on the chunk of ``n`` examples starting at probe row ``start`` (weight one per
example; the ``1/N`` is applied by the caller)."""


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
    # drawn on the CPU, where the generator lives (as every sampler here), then moved
    b = torch.bernoulli(s[None].expand(k, *s.shape).cpu().contiguous(), generator=generator)
    return s[None] - b.to(s.device)


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


# -- any loss and layout: draws and Hessian products from the loss's terms -------------------
PositionDraws = Callable[[Loss, torch.Tensor, torch.Tensor, int, torch.Generator], torch.Tensor]
"""``draws(loss, z [N, P, C], t, k, generator) -> [k, N, P, C]``: ``k`` directions per
position, independent over positions, examples and draws, with ``E[v v^T] = H_ip`` the
position's output Hessian (unmasked and unweighted; ``z`` and ``t`` canonical, as
:class:`fathom.losses.Terms` holds them)."""

PositionProduct = Callable[[Loss, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``product(loss, z [N, P, C], t, v [N, P, C]) -> H_ip v_ip`` per position (unmasked and
unweighted), in closed form."""


def _ce_draws(
    loss: Loss, z: torch.Tensor, t: torch.Tensor, k: int, generator: torch.Generator
) -> torch.Tensor:
    """Cross-entropy: ``v = sqrt(sum_c t'_c) (p - e_yhat)``, ``yhat ~ Categorical(p)`` per
    position (:func:`softmax_ce_samples` over the ``N P`` positions in order), so
    ``E[v v^T] = (sum_c t'_c) (diag p - p p^T)``, the Hessian (``sum_c t'_c`` is one for
    integer labels: :meth:`fathom.losses.CrossEntropy.target_mass`)."""
    n, p, c = z.shape
    v = softmax_ce_samples(z.reshape(n * p, c), t, k, generator).reshape(k, n, p, c)
    if t.is_floating_point():
        v = v * loss.target_mass(z, t).sqrt()[None, ..., None]
    return v


def _factor_draws(
    loss: Loss, z: torch.Tensor, t: torch.Tensor, k: int, generator: torch.Generator
) -> torch.Tensor:
    """Any other loss: ``v = F_ip xi``, ``xi`` Rademacher over the ``K`` columns of the
    loss's Hessian factor (``E[v v^T] = F F^T = H``)."""
    f = loss.hessian_sqrt(z, t)  # [N, P, C, K]
    xi = _rademacher_samples(f[..., 0, :], t, k, generator)  # [k, N, P, K]
    return torch.einsum("npck,snpk->snpc", f, xi)


_POSITION_DRAWS: dict[str, tuple[PositionDraws, str]] = {
    "cross_entropy": (
        _ce_draws,
        "yhat ~ Categorical(softmax(z)) per position, v = sqrt(sum_c t'_c) (p - e_yhat) "
        "(the sampled Fisher; sum_c t'_c = 1 for integer labels)",
    ),
    "mse": (
        lambda loss, z, t, k, g: mse_samples(z, t, k, g),
        "v = sqrt(2) eps, eps ~ N(0, 1) per output entry (E[v^2] = 2, torch's mse_loss "
        "Hessian per entry)",
    ),
    "bce_with_logits": (
        lambda loss, z, t, k, g: bce_samples(z, t, k, g),
        "v = sigmoid(z) - b, b ~ Bernoulli(sigmoid(z)) per output entry (E[v^2] = "
        "sigmoid(z) sigmoid(-z))",
    ),
}
"""The Monte-Carlo draws per loss (:data:`PositionDraws`, with what they are); a loss not
listed is drawn through its Hessian factor (:data:`_FACTOR_DRAWS`)."""
_FACTOR_DRAWS = (
    _factor_draws,
    "v = F xi, F the loss's Hessian factor, xi Rademacher over its columns",
)


def _ce_product(loss: Loss, z: torch.Tensor, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Cross-entropy: ``(sum_c t'_c) (p * v - p (p . v))``, ``O(C)`` per position (the factor's
    product would form ``[C, C - 1]`` per position: out of reach for a vocabulary)."""
    return _softmax_hessian_product(z, v) * loss.target_mass(z, t)[..., None]


def _factor_product(loss: Loss, z: torch.Tensor, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Any other loss: ``F_ip (F_ip^T v_ip)`` (one column for MSE and BCE: ``F^2 v``)."""
    f = loss.hessian_sqrt(z, t)
    return torch.einsum("npck,npk->npc", f, torch.einsum("npck,npc->npk", f, v))


_POSITION_PRODUCTS: dict[str, tuple[PositionProduct, str]] = {
    "cross_entropy": (_ce_product, "H v = (sum_c t'_c) (p * v - p (p . v)) per position"),
}
"""Hutchinson's closed-form Hessian products per loss; a loss not listed applies its Hessian
factor twice (:data:`_FACTOR_PRODUCT`: ``2 v`` for MSE, ``sigmoid(z) sigmoid(-z) v`` for BCE)."""
_FACTOR_PRODUCT = (_factor_product, "H v = F (F^T v) per position, F the loss's Hessian factor")


def _chunk(terms: Terms, output: torch.Tensor, start: int):
    """``(terms, z [n, P, C], t)`` of the chunk of examples ``start .. start + n - 1`` of the
    probe (the probe's weights kept), on ``output``'s device and dtype."""
    part = terms.take(start, start + output.shape[0])
    z = part.layout.canon(output)
    t = part.target.to(z.device)
    return part, z, (t.to(z.dtype) if t.is_floating_point() else t)


def _ggn_loss_samples(terms: Terms, root: float) -> Sampler:
    draws = _POSITION_DRAWS.get(terms.loss.name, _FACTOR_DRAWS)[0]

    def sample(output, rows, k, generator):
        part, z, t = _chunk(terms, output, int(rows[0]))
        v = draws(part.loss, z, t, k, generator) * part.mask.to(z)[None, ..., None]
        return root * part.layout.uncanon(v)

    return sample


def _gram_loss_samples(terms: Terms, root: float) -> Sampler:
    def sample(output, rows, k, generator):
        return root * _rademacher_samples(output, rows, k, generator)

    return sample


def _ggn_loss_product(terms: Terms, factor: float) -> HessianProduct:
    product = _POSITION_PRODUCTS.get(terms.loss.name, _FACTOR_PRODUCT)[0]

    def apply(output, v, start):
        part, z, t = _chunk(terms, output, start)
        hv = product(part.loss, z, t, part.layout.canon(v)) * part.mask.to(z)[..., None]
        return part.layout.uncanon(hv) * factor

    return apply


def _gram_loss_product(terms: Terms, factor: float) -> HessianProduct:
    return lambda output, v, start: v * factor


_LOSS_FAMILIES: dict[str, tuple[Callable[[Terms, float], Sampler], Callable]] = {
    "ggn": (_ggn_loss_samples, _ggn_loss_product),
    "jacobian_gram": (_gram_loss_samples, _gram_loss_product),
}
"""Per sampled family, the MC sampler and the Hutchinson product under a loss's terms."""


def loss_sampler(terms: Terms, family: str) -> Sampler:
    """The MC :data:`Sampler` of ``family`` under ``terms`` (a loss read on the whole probe of
    ``N`` examples), for :func:`mc_diagonals` with the probe's row indices as its target:
    ``[k, n, *out]`` for a chunk of ``n`` consecutive examples, with

        E[v_i v_i^T] = N a D_i,    D_i = sum_p m_ip H_ip (GGN: :data:`_POSITION_DRAWS`),
                                   D_i = I (Jacobian Gram: Rademacher),

    ``a`` the family's scale (:data:`fathom.curvature.families.FAMILIES`: ``s``, ``c``).
    The draws carry ``sqrt(N a)``, so the ``1/N`` of :func:`mc_diagonals` leaves ``a`` and
    its mean estimates the family exactly as :func:`~fathom.curvature.exact.exact_diagonals`
    defines it, for every loss, layout and reduction."""
    root = math.sqrt(terms.layout.n * FAMILIES[family].scale(terms))
    return _LOSS_FAMILIES[family][0](terms, root)


def loss_hessian_product(terms: Terms, family: str) -> HessianProduct:
    """Hutchinson's :data:`HessianProduct` of ``family`` under ``terms``: ``N a D_i v_i`` per
    example (``D_i`` as :func:`loss_sampler`'s, applied in closed form,
    :data:`_POSITION_PRODUCTS`), so that :func:`_hutchinson_diagonals`' ``1/N`` leaves ``a``."""
    factor = float(terms.layout.n * FAMILIES[family].scale(terms))
    return _LOSS_FAMILIES[family][1](terms, factor)


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


def measure(seam: Seam, x, plan: Plan) -> Costs:
    """:class:`Costs` from one captured forward of one example, kept per seam and input
    signature (:func:`fathom.seam.inputs.signature`: a seam is cached per model structure and
    input signature, :mod:`fathom.curvature.twin`; the sizes it measures depend on nothing
    else)."""
    key = signature(x)
    hit = _MEASURED.get(seam)
    if hit is not None and hit[0] == key:
        return hit[1]
    costs = _measure(seam, x)
    _MEASURED[seam] = (key, costs)
    return costs


def _measure(seam: Seam, x) -> Costs:
    with seam.capture() as calls, torch.no_grad():
        out = seam.forward(take(x, slice(0, 1)))
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
        """Fold in ``group [k, ...]`` (``k`` new observations; scratch: centred and squared
        in place, so that a group of probes the size of the model needs no second copy)."""
        k = group.shape[0]
        g_mean = group.mean(0)
        g_m2 = group.sub_(g_mean).square_().sum(0)  # (torch.var_mean over dim 0 is 20x slower)
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
    n = count(x)
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
        rows = slice(start, start + examples_per_chunk)
        xc, yc = take(x, rows), labels[rows]
        nc = count(xc)
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
_PROBES_PER_PASS = 32
"""The most Rademacher probes ``z_k`` one pass applies ``M`` to together: one forward and one
double-vjp graph per chunk of examples, then the Jacobian-vector products and the pullbacks
of all the pass's probes batched by autograd (``is_grads_batched``). The pass's memory grows
linearly in it (:func:`_hutchinson_chunks`), which takes fewer where the budget says so."""


def _hutchinson_chunks(costs: Costs, samples: int, n: int, memory: int) -> tuple[int, int]:
    """``(examples, probes)`` per pass within half of ``memory`` (the other half for the
    model and the accumulators): as many probes as fit with one example, at most
    :data:`_PROBES_PER_PASS` and ``samples``, then as many examples as fit with them. Each
    (probe, example) holds about three activation copies (its Jacobian-vector product and the
    batched pullback's cotangents), each probe about three parameter copies (``z``, ``M z``
    and its pullback); one probe takes ``2 x 8 x 3 x activations`` bytes per example, the
    rule of the one-probe passes."""
    acts, params = max(1, costs.activations), max(1, costs.parameters)
    probes = max(1, min(samples, _PROBES_PER_PASS, memory // (2 * _BYTES * 3 * (acts + params))))
    return max(1, min(n, memory // (2 * _BYTES * 3 * acts * probes))), probes


def _ggn_vector_products(
    model: nn.Module | Callable,
    params: list[torch.Tensor],
    x,
    hessian_product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    z: list[torch.Tensor],
    batched: bool | None,
) -> tuple[list[torch.Tensor], bool]:
    """``(products, batched)``: ``sum_i J_i^T H_i J_i z_k`` over the examples of ``x`` (not yet
    / N) for every probe ``z_k`` of ``z`` (per parameter ``[B, *shape]``, the products alike),
    step by step, and whether the probes went through autograd together.

    ``model`` is called on ``x`` once (a module, or :meth:`fathom.seam.Seam.forward` for a
    model whose output is selected from a tuple or a mapping, or whose input is a tuple or
    dict). ``batched=False``: the probes one at a time on that graph (with ``B = 1``, the
    one-probe estimator operation for operation); ``True``: the ``B`` probes through autograd
    together (``is_grads_batched``; one at a time should that raise); ``None``: batched,
    checked against the first probe taken alone, and looped where torch has no batching rule
    for an operation of the double-vjp or its rule gives another value (a batched pullback
    can be wrong where the plain one is right: :mod:`fathom.seam.check`). The second value
    says which was used.

    Attention runs on the math kernel of ``scaled_dot_product_attention`` (the fused CPU
    kernels have no second derivative); an operation without one is refused by name
    (:class:`FathomError`, pointing to ``estimator="mc"``)."""
    try:
        with sdpa_kernel(SDPBackend.MATH):
            return _ggn_vector_products_unchecked(model, params, x, hessian_product, z, batched)
    except (RuntimeError, NotImplementedError) as err:
        if "derivative" not in str(err) and "not implemented" not in str(err):
            raise
        raise FathomError(
            "Hutchinson needs a Jacobian-vector product, taken by differentiating the "
            f"backward pass, and torch cannot differentiate one of this model's: {err}. "
            "Use estimator='mc' (or 'exact'), which need first derivatives only"
        ) from None


def _ggn_vector_products_unchecked(
    model, params, x, hessian_product, z, batched
) -> tuple[list[torch.Tensor], bool]:
    probes = z[0].shape[0]
    with torch.enable_grad():
        out = model(x)
        # Apply the Jacobian of f onto z: z -> Jz (the double-vjp: J z = d<J^T u, z>/du at any u)
        u = torch.zeros_like(out, requires_grad=True)
        jtu = torch.autograd.grad(out, params, u, create_graph=True, allow_unused=True)
        used = [(g, zi) for g, zi in zip(jtu, z, strict=True) if g is not None]
        if not used:
            return _filled([None] * len(params), params, probes), bool(batched)
        jtu_used, z_used = [g for g, _ in used], [zi for _, zi in used]

        def one(k: int, retain: bool) -> tuple:
            """``J^T H J z_k`` for probe ``k`` alone."""
            jz = torch.autograd.grad(jtu_used, u, [zi[k] for zi in z_used], retain_graph=True)[0]
            # Apply the output Hessian: Jz -> HJz (closed form per example)
            hjz = hessian_product(out.detach(), jz)
            # Apply the transposed Jacobian: HJz -> J^T H J z
            return torch.autograd.grad(out, params, hjz, allow_unused=True, retain_graph=retain)

        if batched is not False:
            try:
                # the same three steps for the B probes at once: Jz [B, *out] -> HJz -> J^T HJz
                jz = torch.autograd.grad(
                    jtu_used, u, z_used, retain_graph=True, is_grads_batched=True
                )[0]
                hjz = torch.stack([hessian_product(out.detach(), v) for v in jz])
                back = torch.autograd.grad(
                    out, params, hjz, allow_unused=True, retain_graph=True, is_grads_batched=True
                )
            except (RuntimeError, NotImplementedError):  # an operation without a batching rule
                back = None
            if batched and back is not None:  # checked on an earlier pass
                return _filled(back, params, probes), True
            first = one(0, retain=True)
            if back is not None and _agrees([b[0] for b in back], first):
                return _filled(back, params, probes), True
            looped = [first, *(one(k, retain=k < probes - 1) for k in range(1, probes))]
        else:
            looped = [one(k, retain=k < probes - 1) for k in range(probes)]
        stacked = [
            None if col[0] is None else torch.stack(col) for col in zip(*looped, strict=True)
        ]
    return _filled(stacked, params, probes), False


def _filled(grads, params: list[torch.Tensor], probes: int) -> list[torch.Tensor]:
    """``[B, *shape]`` per parameter, detached; zeros where a parameter does not reach the
    output."""
    return [
        torch.zeros((probes, *p.shape), dtype=p.dtype, device=p.device) if g is None else g.detach()
        for p, g in zip(params, grads, strict=True)
    ]


def _agrees(got: list, want: tuple) -> bool:
    """The batched products of one probe equal its one-probe products, within ``1e-9`` of the
    largest entry (float64 rounding of a reordered sum is some ``1e-16`` of it; a wrong
    batching rule is off by the size of the entries themselves)."""
    pairs = [(g, w) for g, w in zip(got, want, strict=True) if w is not None]
    if any(g is None for g, _ in pairs):
        return False
    scale = max((float(w.detach().abs().max()) for _, w in pairs if w.numel()), default=0.0)
    tol = 1e-9 * scale + 1e-300
    return all(bool(((g - w).abs() <= tol).all()) for g, w in pairs)


def _hutchinson_diagonals(
    seam: Seam,
    x,
    *,
    products: dict[str, HessianProduct],
    samples: int,
    generator: torch.Generator,
    examples_per_chunk: int,
    probes_per_chunk: int,
) -> tuple[tuple[dict, dict, dict, dict], bool]:
    """Hutchinson diagonals ``(1/K) sum_k z_k * (M z_k)`` (module docstring) of the families
    in ``products`` (:data:`HessianProduct`): ``(estimates as :func:`mc_diagonals`, batched)``.

    The probes are drawn ``z_1, z_2, ...`` in order (per probe, parameter after parameter) and
    applied ``probes_per_chunk`` at a time (:func:`_ggn_vector_products`), batched unless the
    seam pulls back directions one at a time (``seam.batched_pullback`` off, or a layer's
    ``loop_directions``) or the first pass finds batching unavailable or wrong; ``batched``
    says whether they were. The draws do not depend on the chunks, so every layout gives the
    one-probe-at-a-time estimate to rounding (``probes_per_chunk=1``: that estimator)."""
    named = dict(seam.model.named_parameters())
    names, params = list(named), list(named.values())
    n = count(x)
    loops = not seam.batched_pullback or any(la.loop_directions for la in seam.layers)
    batched: bool | None = False if loops or probes_per_chunk == 1 else None
    out_d, out_se, out_ptr, out_tr = {}, {}, {}, {}
    for f, product in products.items():
        entry = {p: _Moments() for p in names}
        ptrace = {p: _Moments() for p in names}
        trace = _Moments()
        for _, k in _groups(samples, probes_per_chunk):
            # z_k = 2 b - 1, b = randint(0, 2) per parameter, probe after probe (the draws of
            # one probe at a time: written into [k, *shape] float64 rows, the same integers)
            z = [torch.empty((k, *p.shape), dtype=torch.float64) for p in params]
            for j in range(k):
                for zi, p in zip(z, params, strict=True):
                    torch.randint(0, 2, p.shape, generator=generator, out=zi[j])
            z = [zi.mul_(2.0).sub_(1.0).to(p) for zi, p in zip(z, params, strict=True)]
            mz: list[torch.Tensor] | None = None  # sum over the chunks of examples
            for start in range(0, n, examples_per_chunk):
                part, batched = _ggn_vector_products(
                    seam.forward,
                    params,
                    take(x, slice(start, start + examples_per_chunk)),
                    lambda out, v, start=start, h=product: h(out, v, start),
                    z,
                    batched,
                )
                mz = part if mz is None else [a.add_(g) for a, g in zip(mz, part, strict=True)]
            t_all: torch.Tensor | float = 0.0
            for name, zi, m in zip(names, z, mz, strict=True):
                d = m.mul_(zi).div_(n)  # [k, *shape]: each probe's z_k * (M z_k)
                per_probe = d.reshape(k, -1).sum(1)
                t_all = t_all + per_probe
                entry[name].add(d)
                ptrace[name].add(per_probe)
            trace.add(
                t_all if isinstance(t_all, torch.Tensor) else torch.zeros(k, dtype=torch.float64)
            )
        out_d[f] = {p: entry[p].mean for p in names}
        out_se[f] = {p: (entry[p].variance / samples).sqrt() for p in names}
        out_ptr[f] = {
            p: (float(ptrace[p].mean), math.sqrt(float(ptrace[p].variance) / samples))
            for p in names
        }
        out_tr[f] = (float(trace.mean), math.sqrt(float(trace.variance) / samples))
    return (out_d, out_se, out_ptr, out_tr), bool(batched)


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
    loss: str | Loss | None = None,
    output: Selector = None,
    class_dim: int | None = None,
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

    ``loss``, ``output`` and ``class_dim`` as :func:`~fathom.curvature.exact.exact_diagonals`
    (any loss, reduction, output layout and input structure; :func:`loss_diagonals`); left
    unset, ``[N, C]`` logits with integer labels ``[N]`` and the mean cross-entropy.
    """
    if loss is not None or output is not None or class_dim is not None:
        return loss_diagonals(
            model,
            x,
            y,
            loss=make_loss("cross_entropy" if loss is None else loss, class_dim=class_dim),
            output=output,
            families=families,
            estimator=estimator,
            samples=samples,
            seed=seed,
            budget=budget,
            standard_errors=standard_errors,
        )
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
        ex, probes = _hutchinson_chunks(costs, samples, n, budget.memory_bytes)
        products = {f: (lambda out, v, start, h=_HESSIAN_PRODUCTS[f]: h(out, v)) for f in sampled}
        est, batched = _hutchinson_diagonals(
            seam,
            x64,
            products=products,
            samples=samples,
            generator=generator,
            examples_per_chunk=ex,
            probes_per_chunk=probes,
        )
        layout = {"examples_per_chunk": ex, "probes_per_chunk": probes, "batched": batched}
    else:
        est = ({}, {}, {}, {})
    return _assembled(seam, plan, est, exact, sampled, name, samples, seed, choice, layout)


def loss_diagonals(
    model: nn.Module,
    x,
    y: torch.Tensor,
    *,
    loss: Loss,
    output: Selector = None,
    families: str | Iterable[str] = "ggn",
    estimator: str = "auto",
    samples: int = 8,
    seed: int = 0,
    budget: Budget | None = None,
    standard_errors: bool = True,
) -> Estimate:
    """:func:`diagonals` for any ``loss`` (:class:`fathom.losses.Loss`: cross-entropy with
    integer or probability targets, ``ignore_index`` and label smoothing, MSE, BCE with
    logits; mean or sum), output layout (``[N, C]``, ``[N, C, d...]``, ``[N, T, V]``) and
    input structure, each family as :func:`~fathom.curvature.exact.exact_diagonals` defines
    it (:mod:`fathom.curvature.families`).

    MC draws per example ``sqrt(N a)`` times the loss's directions
    (:func:`loss_sampler`: per position, independently, :data:`_POSITION_DRAWS`, masked
    where ``ignore_index``); Hutchinson applies ``N a sum_p m_ip H_ip`` in closed form
    (:func:`loss_hessian_product`); both give the module docstring's standard errors.
    ``auto`` compares exact's memory and its directions per example, ``P K`` (+ 1 for the
    empirical Fisher, + ``E`` for the Jacobian Gram;
    :func:`fathom.curvature.families.total_directions`), with ``budget``. The record's
    ``layout`` names the loss and, per sampled family, the draws (MC) or the Hessian
    product (Hutchinson)."""
    tune_cpu_allocator()
    name = resolve_estimator(estimator)
    plan = Plan(resolve_families(families))
    budget = budget if budget is not None else Budget()
    _check_arguments(name, budget, samples, seed)
    _, x64, seam = prepared(model, x, output=output, loss=loss)
    n = count(x64)
    with torch.no_grad():
        layout = loss.layout(tuple(seam.forward(take(x64, slice(0, 1))).shape))
    target = y.to(first_device(x64)) if isinstance(y, torch.Tensor) else y
    terms = loss.terms((n, *layout.shape[1:]), target)
    costs = measure(seam, x64, plan)
    width = total_directions(plan.families, loss, layout)
    if name == "auto":
        name, why = choose(costs, plan, samples, budget, n, width)
        choice = f"auto chose {name}: {why}"
    else:
        choice = f"{name} requested"
    sampled = [f for f in plan.families if f in _SAMPLED] if name != "exact" else []
    exact_fams = [f for f in plan.families if f not in sampled]
    exact = (
        exact_diagonals(model, x, y, loss=loss, families=exact_fams, output=output)
        if exact_fams
        else {}
    )
    generator = torch.Generator().manual_seed(seed)
    record: dict = {"loss": repr(loss)}
    est: tuple[dict, dict, dict, dict] = ({}, {}, {}, {})
    if sampled and name == "mc":
        ex, per = _mc_chunks(costs, len(sampled), samples, n, budget.memory_bytes)
        record |= {"examples_per_chunk": ex, "samples_per_chunk": per}
        record |= {"standard_errors": standard_errors, "draws": _said(loss, sampled, "mc")}
        est = mc_diagonals(
            seam,
            x64,
            torch.arange(n),
            samplers={f: loss_sampler(terms, f) for f in sampled},
            samples=samples,
            generator=generator,
            examples_per_chunk=ex,
            samples_per_chunk=per,
            standard_errors=standard_errors,
        )
    elif sampled:
        ex, probes = _hutchinson_chunks(costs, samples, n, budget.memory_bytes)
        record |= {"examples_per_chunk": ex, "probes_per_chunk": probes}
        est, batched = _hutchinson_diagonals(
            seam,
            x64,
            products={f: loss_hessian_product(terms, f) for f in sampled},
            samples=samples,
            generator=generator,
            examples_per_chunk=ex,
            probes_per_chunk=probes,
        )
        record |= {"batched": batched, "products": _said(loss, sampled, "hutchinson")}
    return _assembled(seam, plan, est, exact, sampled, name, samples, seed, choice, record)


def estimator_rows() -> list[tuple[str, str, str]]:
    """``(loss, MC draws, Hutchinson's product)`` of the GGN for every loss of
    :data:`fathom.losses.LOSSES`, then the Jacobian Gram's (``docs/curvature.md``)."""
    from fathom.losses.kinds import LOSSES

    rows = [
        (
            f"`{name}`",
            _POSITION_DRAWS.get(name, _FACTOR_DRAWS)[1],
            _POSITION_PRODUCTS.get(name, _FACTOR_PRODUCT)[1],
        )
        for name in LOSSES
    ]
    rows.append(("any other `Loss`", _FACTOR_DRAWS[1], _FACTOR_PRODUCT[1]))
    rows.append(("(`jacobian_gram`, every loss)", *_said_gram()))
    return rows


def _said_gram() -> tuple[str, str]:
    return "v Rademacher over every output entry", "H v = v (the identity)"


def _said(loss: Loss, families: list[str], estimator: str) -> dict[str, str]:
    """What each sampled family draws (MC) or applies (Hutchinson) under ``loss``."""
    if estimator == "mc":
        ggn = _POSITION_DRAWS.get(loss.name, _FACTOR_DRAWS)[1]
        said = {"ggn": ggn, "jacobian_gram": _said_gram()[0]}
    else:
        ggn = _POSITION_PRODUCTS.get(loss.name, _FACTOR_PRODUCT)[1]
        said = {"ggn": ggn, "jacobian_gram": _said_gram()[1]}
    return {f: said[f] for f in families}


def _assembled(
    seam: Seam,
    plan: Plan,
    est: tuple[dict, dict, dict, dict],
    exact: dict,
    sampled: list[str],
    name: str,
    samples: int,
    seed: int,
    choice: str,
    layout: dict,
) -> Estimate:
    """The :class:`Estimate` of :func:`diagonals` and :func:`loss_diagonals`: each sampled
    family from ``est`` (diagonals, standard errors, per-parameter and total traces with their
    errors), every other family from ``exact`` with its traces summed from its diagonal."""
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
