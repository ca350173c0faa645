"""Exact float64 curvature diagonals of any model, for any loss and output layout.

**Any loss, any layout.** The loss (:mod:`fathom.losses`: cross-entropy over ``[N, C]``,
``[N, C, d...]`` or ``[N, T, V]``, MSE, BCE; mean or sum) and the families' output directions
and scales are one table each (:mod:`fathom.curvature.families`, whose docstring holds every
family's formula and normalization; ``docs/curvature.md`` is generated from it). Below, the
``[N, C]`` cross-entropy case with the mean, where every family is a **mean over the N probe
examples** (the curvature of the mean CE over the probe; CE per example unaveraged). With
``J_i`` example ``i``'s logit Jacobian in the parameters and ``v_ik`` a set of output
directions, the matrix ``M = (1/N) sum_i sum_k (J_i^T v_ik)(J_i^T v_ik)^T`` has the diagonal

    diag(M) = (1/N) sum_i sum_k (J_i^T v_ik)^2        (elementwise square, every parameter)

and the three matrices (the *families*) differ only in their output directions:

* CE **GGN** ``(1/N) sum_i J_i^T H_i J_i``: ``v_ik = s_ik``, the ``C - 1`` columns of the
  reduced square-root factor ``R_i`` of the softmax Hessian ``H_i = diag(p_i) - p_i p_i^T``
  (``H_i = R_i R_i^T``, rank ``C - 1``: :mod:`fathom.losses.softmax`; exact, not sampled);
* **empirical Fisher** ``(1/N) sum_i g_i g_i^T`` (observed labels): one direction ``r_i = p_i - e_y``;
* **logit-Jacobian Gram** ``(1/N) sum_i J_i^T J_i``: ``v_ic = e_c``, the ``C`` unit logits.

With several positions per example (a sequence, an image) the directions of one example
are many (``T (V - 1)`` for the GGN of ``[N, T, V]``), so they are pulled back in groups
that keep memory bounded (:func:`fathom.curvature.families.groups`) as well as in chunks of
examples.

How (the curvlinops way, step by step): one forward of the float64 copy under the seam's
hooks; one backward of ``D`` output directions to every layer output
(:func:`fathom.curvature.probe.pull_back`), where the directions are chosen by the requested
families (:class:`Plan`):

* with the Jacobian Gram: the ``C`` unit directions ``e_c`` (the Jacobian rows ``J_i^T e_c``),
  from which the GGN and Fisher rows follow by linearity, ``J^T s_ik = sum_c R_i[c, k] J^T e_c``
  and ``J^T r_i = sum_c r_ic J^T e_c`` (one ``[K+1, C] @ [C, M]`` product per example);
* without it: the families' own directions, pulled back directly (``C - 1`` for the GGN, one
  for the Fisher, ``C`` for both), so nothing is mixed;

then per layer

* ``nn.Linear`` with one row per example (``a_i [d_in]``, ``u_id`` the cotangent of direction
  ``d``): ``diag_W = (1/N) sum_i (sum_k u_iko^2) a_ij^2`` is one matmul; per-example gradients
  are never formed;
* ``nn.Linear`` over positions and ``nn.MultiheadAttention`` (its projections are linear maps
  over positions, :func:`fathom.seam.pex_attention.attention_forms`): the family rows are mixed
  from the cotangents *before* the outer products (``J^T v`` is linear in ``v``), then
  ``sum_i sum_k (sum_t r_ikt a_it^T)^2`` by one batched matmul per example and block;
* every other layer (Conv1d/2d, BatchNorm, LayerNorm, Embedding, root operations, and by
  the generic ``torch.func`` path custom modules): the per-example
  gradients of the pulled-back directions (:func:`fathom.seam.pex.per_example_grads`), mixed as
  above where needed and squared, in chunks of examples that bound memory.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch
from torch import nn

from fathom.curvature.families import FAMILIES, group_size, groups, scaled, total_directions
from fathom.curvature.probe import pull_back, unit_directions
from fathom.curvature.twin import prepared
from fathom.errors import FathomError
from fathom.losses.kinds import CrossEntropy, Loss, Terms, make_loss
from fathom.losses.layout import Layout, Selector
from fathom.losses.softmax import label_residual, softmax_hessian_sqrt_reduced, softmax_parts
from fathom.seam import Call, Layer, Seam
from fathom.seam.inputs import count, first_device, take
from fathom.seam.pex import linear_rows, per_example_grads
from fathom.seam.pex_attention import Form, attention_forms
from fathom.seam.pex_embedding import embedding_pairs
from fathom.train.allocator import tune_cpu_allocator

CURVATURE_FAMILIES: tuple[str, ...] = tuple(FAMILIES)  # ggn, empirical_fisher, jacobian_gram
# The families' earlier short names (diagonal files written before the rename use them as
# key prefixes): still accepted as input, never produced.
OLD_NAMES: dict[str, str] = {"fisher": "empirical_fisher", "jacobian": "jacobian_gram"}


class Diagonals(dict):
    """``{family: {param_name: diagonal}}``; an old family name still reads (with a
    ``FutureWarning`` naming the new key), so code written before the rename keeps working."""

    def __missing__(self, key: str) -> dict[str, torch.Tensor]:
        if OLD_NAMES.get(key) not in self:
            raise KeyError(key)
        warnings.warn(f"diagonals[{key!r}] is now [{OLD_NAMES[key]!r}]", FutureWarning, 2)
        return self[OLD_NAMES[key]]


_ELEMENTS = 2**25  # per chunk: directions x examples x parameters of the largest materialized layer


def resolve_families(families: str | Iterable[str]) -> tuple[str, ...]:
    """``"all"``, one family name or several -> the requested families in
    :data:`CURVATURE_FAMILIES` order (an old name of :data:`OLD_NAMES` reads as its family)."""
    if families == "all":
        return CURVATURE_FAMILIES
    try:
        chosen = {families} if isinstance(families, str) else set(families)
    except TypeError:
        chosen = {repr(families)}  # not a name nor an iterable of names: refused below
    chosen = {OLD_NAMES.get(f, f) if isinstance(f, str) else f for f in chosen}
    unknown = sorted(str(f) for f in chosen - set(CURVATURE_FAMILIES))
    if unknown or not chosen:
        raise FathomError(
            f"unknown curvature families {unknown or '(none given)'}: choose from "
            f"{', '.join(CURVATURE_FAMILIES)} or 'all'"
        )
    return tuple(k for k in CURVATURE_FAMILIES if k in chosen)


@dataclass(frozen=True)
class OutputDirections:
    """Per-example output directions: ``R [N, C, K]`` (GGN; the reduced square-root factor
    of the softmax Hessian, ``K = C - 1`` columns: :mod:`fathom.losses.softmax`) and
    ``r [N, C]`` (Fisher)."""

    sqrt_hessian: torch.Tensor
    residual: torch.Tensor

    @staticmethod
    def of(logits: torch.Tensor, labels: torch.Tensor) -> OutputDirections:
        parts = softmax_parts(logits)
        return OutputDirections(softmax_hessian_sqrt_reduced(parts), label_residual(parts, labels))


@dataclass(frozen=True)
class Plan:
    """Which output directions are pulled back for ``families``, and how each family's
    per-example rows ``J_i^T v_ik`` follow from the pulled-back ones (module docstring)."""

    families: tuple[str, ...] = CURVATURE_FAMILIES

    @property
    def units(self) -> bool:
        """Pull back the ``C`` unit directions (needed by the Jacobian Gram) and mix."""
        return "jacobian_gram" in self.families

    def grad_outputs(self, logits: torch.Tensor, dirs: OutputDirections) -> torch.Tensor:
        """The pulled-back directions ``[D, N, C]``."""
        if self.units:
            return unit_directions(logits)
        parts = []
        if "ggn" in self.families:
            parts.append(dirs.sqrt_hessian.permute(2, 0, 1))  # [K, N, C]: v_ik = S_i[:, k]
        if "empirical_fisher" in self.families:
            parts.append(dirs.residual[None])
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def rows(self, r: torch.Tensor, dirs: OutputDirections) -> dict[str, torch.Tensor]:
        """``{family: [N, K_f, M]}`` from the rows ``r [N, D, M]`` of the pulled-back directions."""
        k = dirs.sqrt_hessian.shape[2]
        if not self.units:
            out, at = {}, 0
            for kind, width in (("ggn", k), ("empirical_fisher", 1)):
                if kind in self.families:
                    out[kind], at = r[:, at : at + width], at + width
            return out
        mix = []
        if "ggn" in self.families:
            mix.append(dirs.sqrt_hessian.transpose(1, 2))  # [N, K, C]
        if "empirical_fisher" in self.families:
            mix.append(dirs.residual[:, None, :])  # [N, 1, C]
        out = {"jacobian_gram": r}
        if mix:
            mixed = torch.bmm(torch.cat(mix, 1).to(r.dtype), r)  # [N, K(+1), M]
            if "ggn" in self.families:
                out["ggn"] = mixed[:, :k]
            if "empirical_fisher" in self.families:
                out["empirical_fisher"] = mixed[:, -1:]
        return out

    def width(self, classes: int) -> int:
        """Rows materialized per example and parameter (pulled back plus mixed)."""
        if self.units:
            return classes + classes * ("ggn" in self.families) + self._fisher
        return classes * ("ggn" in self.families) + self._fisher

    @property
    def _fisher(self) -> int:
        return int("empirical_fisher" in self.families)


Sums = dict[str, torch.Tensor]  # kind -> unnormalized sum over examples, one parameter


def single_row(layer: Layer, calls: list[Call]) -> bool:
    """A linear layer called once on ``[N, d_in]``: the factorized (never materialized) path."""
    return (
        layer.kind == "linear"
        and len(calls) == 1
        and calls[0].input_leaves()[0].dim() == 2
        and calls[0].in_dims[0] == (0, 1)
    )


def _squares(
    plan, kind: str, sq: torch.Tensor, place=None, examples=None, transposed: bool = False
) -> dict:
    """``{label: sum}`` of the squared rows ``sq [G, K, *entries]`` of family ``kind`` (``G``
    groups: the examples, or an embedding's (example, token) pairs, which ``place`` adds into
    the weight and ``examples`` maps ``[G, K] -> [N, K]``; ``transposed``: the entries' last
    two dimensions are swapped): a plan's own ``squares`` where it has one (Monte-Carlo's
    per-example spreads: :mod:`fathom.curvature.estimate`), else ``{kind: sum over groups and
    rows}``. ``sq`` is scratch: a plan may overwrite it."""
    own = getattr(plan, "squares", None)
    if own is not None:
        return own(kind, sq.transpose(-1, -2) if transposed else sq, place, examples)
    s = sq.sum((0, 1)) if place is None else place(sq.sum(1))
    return {kind: s.T if transposed else s}


def _join(plan, label, parts: list[torch.Tensor], shape) -> torch.Tensor:
    """One parameter's blocks (an attention's q, k, v) of ``label`` joined into its shape (a
    plan's own ``join`` where it has one: per-example traces add)."""
    own = getattr(plan, "join", None)
    return own(label, parts, shape) if own is not None else torch.cat(parts).reshape(shape)


def _linear_sums(layer, calls, cots, n: int, dirs, plan: Plan) -> dict[str, Sums]:
    a, u = linear_rows(layer, calls, cots, n, directions=True)
    a, u = a[:, 0], u[:, :, 0]  # [N, d_in], [D, N, d_out]
    rows = plan.rows(u.transpose(0, 1), dirs)  # family -> [N, K_f, d_out]
    own = getattr(plan, "factored", None)
    if own is not None:  # x_iko,j = u_iko^2 a_ij^2: the plan reduces the two factors
        out: dict[str, Sums] = {"weight": {}, "bias": {}}
        for kind, r in rows.items():
            w, b = own(kind, r.square(), a.square())
            out["weight"].update(w)
            out["bias"].update(b)
        if "bias" not in layer.params:
            del out["bias"]
        return out
    kinds = list(rows)
    sq = torch.cat([rows[k].square().sum(1) for k in kinds], dim=1)  # [N, F * d_out]
    d_out = u.shape[-1]
    out = {"weight": dict(zip(kinds, (sq.T @ a.square()).split(d_out), strict=True))}
    if "bias" in layer.params:
        out["bias"] = dict(zip(kinds, sq.sum(0).split(d_out), strict=True))
    return out


def _materialized_sums(layer, calls, cots, n: int, dirs, plan: Plan) -> dict[str, Sums]:
    grads = per_example_grads(layer, calls, cots, n, directions=True)
    out = {}
    for name, j in grads.items():
        shape = j.shape[2:]
        r = j.transpose(0, 1).reshape(n, j.shape[0], -1)  # [N, D, numel]
        out[name] = {}
        for k, v in plan.rows(r, dirs).items():
            if getattr(plan, "squares", None) is None:
                out[name][k] = v.square().sum((0, 1)).reshape(shape)
            else:
                out[name] |= _squares(plan, k, v.square().reshape(n, v.shape[1], *shape))
    return out


def _embedding_sums(layer, calls, cots, n: int, dirs, plan: Plan) -> dict[str, Sums] | None:
    """One embedding call, rows not mixed per example (no units): each (example, token) row
    squared, added per token (never ``[D, N, V, E]``); ``None`` otherwise."""
    if layer.kind != "embedding" or len(calls) != 1 or plan.units:
        return None
    rows, tok, ex = embedding_pairs(layer, calls[0], cots[0], n, examples=True)  # [D, P, E], [P]
    zero, mixed = rows.new_zeros(layer.module.weight.shape), plan.rows(rows.transpose(0, 1), dirs)

    def place(t: torch.Tensor) -> torch.Tensor:
        return zero.index_add(0, tok, t)

    def examples(t: torch.Tensor) -> torch.Tensor:  # [P, K] -> [N, K]
        return t.new_zeros(n, t.shape[1]).index_add_(0, ex, t)

    out = {}
    for k, r in mixed.items():
        out |= _squares(plan, k, r.square(), place, examples)
    return {"weight": out}


def _forms(layer: Layer, calls: list[Call], cots, n: int) -> dict[str, Form] | None:
    """A linear layer over positions or an attention layer as linear maps over positions
    (:func:`fathom.seam.pex_attention.attention_forms`; calls joined along the positions), or
    ``None`` (the per-example gradients are materialized instead)."""
    if layer.kind == "linear" and calls:
        a, u = linear_rows(layer, calls, cots, n, directions=True)
        return {"weight": [(u, a)], "bias": [(u, None)]}
    if layer.kind != "attention" or not calls:
        return None
    per_call = [attention_forms(layer.module, c, t, n, True) for c, t in zip(calls, cots)]
    if any(f is None for f in per_call):
        return None
    if len(per_call) == 1:
        return per_call[0]
    if len({tuple(len(b) for b in f.values()) for f in per_call}) > 1:
        return None  # self- and cross-attention calls mixed: blocks differ (materialized)
    return {
        name: [
            (
                torch.cat([f[name][j][0] for f in per_call], dim=2),
                None if a is None else torch.cat([f[name][j][1] for f in per_call], dim=1),
            )
            for j, (_, a) in enumerate(blocks)
        ]
        for name, blocks in per_call[0].items()
    }


def _form_sums(layer: Layer, forms: dict[str, Form], dirs, plan: Plan) -> dict[str, Sums]:
    """``sum_i sum_k (sum_t r_ikt a_it^T)^2`` per block, with the family rows ``r`` mixed from
    the pulled-back cotangents before the outer products (``J^T v`` is linear in ``v``), so
    only ``[N, K, O, I]`` per block is formed, never ``[D, N, *shape]`` per parameter."""
    shapes = layer.shapes()
    out = {}
    mixed: dict[int, dict[str, torch.Tensor]] = {}  # per cotangent block (a weight and its bias)
    for name in layer.params:
        sums: dict = {}
        for g, a in forms[name]:
            d, n, t, o = g.shape
            if id(g) not in mixed:
                mixed[id(g)] = plan.rows(g.transpose(0, 1).reshape(n, d, t * o), dirs)
            for kind, r in mixed[id(g)].items():
                r = r.reshape(n, -1, t, o)  # [N, K, T, O]
                if a is None:  # a bias: sum_i sum_k (sum_t r_ikt)^2
                    got = _squares(plan, kind, r.sum(2).square())
                elif o <= a.shape[-1]:  # [O, T] @ [T, I] per example and row (one
                    # broadcast matmul), squared in place, summed over examples and rows
                    w = torch.matmul(r.transpose(-1, -2), a[:, None])  # [N, K, O, I]
                    got = _squares(plan, kind, w.square_())
                else:  # the same sums transposed: the wider side last multiplies faster
                    w = torch.matmul(a.transpose(-1, -2)[:, None], r)  # [N, K, I, O]
                    got = _squares(plan, kind, w.square_(), transposed=True)
                for label, v in got.items():
                    sums.setdefault(label, []).append(v)
        out[name] = {k: _join(plan, k, v, shapes[name]) for k, v in sums.items()}
    return out


def layer_sums(layer, calls, cots, n: int, dirs, plan: Plan | None = None) -> dict[str, Sums]:
    """``{local param: {kind: sum_i sum_k (J_i^T v_ik)^2}}`` for one layer (not yet / N).

    ``cots`` are the cotangents of ``plan``'s pulled-back directions (default: every family,
    from the ``C`` unit directions)."""
    plan = plan or Plan()
    if single_row(layer, calls):
        return _linear_sums(layer, calls, cots, n, dirs, plan)
    if (sums := _embedding_sums(layer, calls, cots, n, dirs, plan)) is not None:
        return sums
    forms = _forms(layer, calls, cots, n)
    if forms is not None:
        return _form_sums(layer, forms, dirs, plan)
    return _materialized_sums(layer, calls, cots, n, dirs, plan)


def _sizes(seam: Seam, x, plan: Plan, loss: Loss) -> tuple[Layout, int, int]:
    """``(layout of one example's output, examples per chunk, entries of the largest
    materialized layer)``: the rows the families materialize per example times the largest
    materialized layer stay in budget."""
    with seam.capture() as calls, torch.no_grad():
        layout = loss.layout(tuple(seam.forward(take(x, slice(0, 1))).shape))
    largest = max(
        (
            sum(t.numel() for t in layer.tensors().values())
            for layer in seam.layers
            if not single_row(layer, calls[layer.name])
        ),
        default=0,
    )
    width = total_directions(plan.families, loss, layout)
    return layout, max(1, _ELEMENTS // max(1, width * largest)), largest


def _layout(seam: Seam, x, plan: Plan, loss: Loss | None = None) -> tuple[Layout, int]:
    """``(layout of one example's output, examples per chunk)`` (:func:`_sizes`)."""
    return _sizes(seam, x, plan, loss or CrossEntropy())[:2]


def exact_diagonals(
    model: nn.Module,
    x,
    y: torch.Tensor,
    *,
    loss: str | Loss = "cross_entropy",
    families: str | Iterable[str] = "all",
    output: Selector = None,
    class_dim: int | None = None,
    chunk_size: int | None = None,
) -> Diagonals:
    """Exact float64 ``{family: {param_name: diagonal}}`` on ``(x, y)`` (:class:`Diagonals`).

    ``loss``: a name of :data:`fathom.losses.LOSSES` (``"cross_entropy"``, ``"mse"``,
    ``"bce_with_logits"``) or a :class:`fathom.losses.Loss` with its options
    (``make_loss("cross_entropy", ignore_index=0, label_smoothing=0.1, reduction="sum")``);
    ``class_dim`` says where the classes of a cross-entropy output are (``1``: PyTorch's
    ``[N, C, d1, ...]``; ``-1``: ``[N, T, V]``; not needed for ``[N, C]``). ``y`` is the
    loss's target (:mod:`fathom.losses.kinds`). ``x`` is a tensor, a tuple or a dict of
    tensors with a leading example dimension (:mod:`fathom.seam.inputs`); ``output`` selects
    the output of a model returning a tuple (an index) or a mapping (``"logits"``).

    Families (``"all"`` or any of :data:`CURVATURE_FAMILIES`; only those are computed; the
    old names ``"fisher"`` and ``"jacobian"`` are read as the last two), each one row of
    :data:`fathom.curvature.families.FAMILIES` (its formula and normalization there): the GGN
    of the reduced loss ``sum_i sum_p w_ip J_ip^T H_ip J_ip``, the empirical Fisher
    ``c sum_i g_i g_i^T`` (one example = its whole output: sequence or image) and the
    output-Jacobian Gram ``c sum_i J_i^T J_i``; for ``[N, C]`` cross-entropy with the mean
    every one is the ``(1/N) sum_i`` of the module docstring. Keyed by every name of
    ``model.named_parameters()``, shaped like the parameter. ``model`` is left untouched (a
    float64 copy in dense evaluation mode is used, cached with its seam per model structure:
    :mod:`fathom.curvature.twin`). A module the seam cannot cover is refused, naming it; so
    is a layout or target the loss cannot read. Memory stays bounded: chunks of examples
    (``chunk_size``, default from the budget) and, where one example's directions exceed
    the budget, groups of output directions. The first call tunes glibc's allocator
    process-wide as ``fathom train`` does
    (:func:`fathom.train.allocator.tune_cpu_allocator`; numerics unchanged).
    """
    tune_cpu_allocator()
    loss = make_loss(loss, class_dim=class_dim)
    plan = Plan(resolve_families(families))
    model64, x, seam = prepared(model, x, output=output, loss=loss)
    n = count(x)
    layout, auto_chunk, largest = _sizes(seam, x, plan, loss)
    target = y.to(first_device(x)) if isinstance(y, torch.Tensor) else y
    terms = loss.terms((n, *layout.shape[1:]), target)
    chunk = chunk_size or auto_chunk
    width = total_directions(plan.families, loss, layout)
    most = group_size(width, min(chunk, n), layout.entries, largest, _ELEMENTS)
    params = dict(model64.named_parameters())
    total = {k: {p: torch.zeros_like(t).detach() for p, t in params.items()} for k in plan.families}
    for start in range(0, n, chunk):
        xc, tc = take(x, slice(start, start + chunk)), terms.take(start, start + chunk)
        _accumulate(seam, xc, tc, plan, most, total)
    return Diagonals(
        {k: {p: scaled(v, FAMILIES[k].scale(terms)) for p, v in total[k].items()} for k in total}
    )


def _accumulate(seam: Seam, x, terms: Terms, plan: Plan, most: int, total: dict) -> None:
    """Add ``sum_i sum_d (J_i^T v_id)^2`` of every family on the chunk ``x`` to ``total``:
    one forward, then one pullback per group of at most ``most`` output directions
    (:func:`fathom.curvature.families.groups`)."""
    n = terms.layout.n
    pending: list = []

    def first(z: torch.Tensor) -> torch.Tensor:
        pending.append(groups(plan.families, terms, z, most))
        pending.append(next(pending[0]))
        return pending[1].directions

    pb = pull_back(seam, x, first, keep_graph=True)
    stream, group = pending
    while group is not None:
        for layer in seam.layers:
            calls = pb.calls[layer.name]
            sums = layer_sums(layer, calls, pb.cotangents[layer.name], n, None, group)
            for local, qualified in zip(layer.params, layer.qualified, strict=True):
                for kind, v in sums[local].items():
                    total[kind][qualified] += v.detach()  # (an embedding's rows carry a graph)
        group = next(stream, None)
        if group is not None:
            cots = seam.cotangents(
                pb.calls, pb.output, group.directions, directions=True, retain_graph=True
            )
            pb = replace(pb, cotangents=cots)
