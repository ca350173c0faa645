"""The curvature families as one table: each family is its output directions and its scale.

Every family is a matrix ``M = a sum_i sum_d (J_i^T v_id)(J_i^T v_id)^T`` over the examples
``i`` of the probe, with ``J_i`` the Jacobian of example ``i``'s whole output ``[*out]`` in
the parameters, ``v_id`` output directions ``[*out]`` and ``a`` a scalar; its diagonal is
``a sum_i sum_d (J_i^T v_id)^2``. A family is one :class:`Family` row in :data:`FAMILIES`:
how many *items* (positions, entries, one) it has per example, how many directions each
item gives, the directions themselves (without ``a``, built item range by item range so
that memory stays bounded) and ``a``. With a loss read on the output
(:class:`fathom.losses.Terms`: ``L = sum_i sum_p w_ip l_ip``, ``w_ip = s m_ip``,
``L = c sum_i L_i``; :mod:`fathom.losses.kinds`):

* ``ggn``: the GGN of ``L``, ``sum_i sum_p w_ip J_ip^T H_ip J_ip``: items are positions, each
  gives the ``K`` columns of the loss's Hessian factor ``m_ip F_ip`` (the reduced ``C - 1``
  for softmax cross-entropy), ``a = s``;
* ``empirical_fisher``: ``c sum_i g_i g_i^T`` with ``g_i = grad L_i`` the gradient of example
  ``i``'s loss, ``L_i = (1/c) sum_p w_ip l_ip`` (one example is the whole sequence or image,
  every position of it: not a token or a pixel): one direction, ``sum_p m_ip dl_ip/dz_ip``,
  ``a = s^2 / c``;
* ``jacobian_gram``: ``c sum_i J_i^T J_i`` over every output entry: items are entries, one
  unit direction each, ``a = c``.

For ``[N, C]`` cross-entropy with ``reduction="mean"`` every ``a`` is ``1/N``: the ``(1/N)``
normalization of :mod:`fathom.curvature.exact`. **Against curvlinops**: its GGN is the same
matrix for every loss and layout; its empirical Fisher agrees for ``[N, C]`` cross-entropy
and for ``reduction="sum"`` over ``[N, C]`` outputs, but it sums the outer products of each
*position's* gradient (a token's, a pixel's) where fathom takes the example's, and for a
mean MSE or BCE it is ``E`` times fathom's (it counts the ``E`` entries in ``c``).

**Mixing.** With the Jacobian Gram the unit directions are pulled back anyway, and every
other family's rows follow from theirs by linearity, ``J^T v = sum_e v_e J^T e_e``
(:class:`Pulled`: one ``[K, E] @ [E, M]`` product per example); this is done where an
example's output is one position (``[N, C]``) or a few entries. Otherwise each family's
own directions are pulled back, in groups of bounded size (:func:`groups`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction

import torch

from fathom.losses.kinds import Loss, Terms
from fathom.losses.layout import Layout


@dataclass(frozen=True)
class Family:
    """One curvature family (module docstring)."""

    name: str
    definition: str
    said_directions: str
    said_scale: str
    items: Callable[[Layout], int]
    width: Callable[[Loss, Layout], int]
    directions: Callable[[Terms, torch.Tensor, int, int], torch.Tensor]
    scale: Callable[[Terms], Fraction]


def _units(terms: Terms, z: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """The unit directions of output entries ``start .. stop - 1``, ``[stop - start, n, *out]``."""
    n, e = z.shape[0], terms.layout.entries
    eye = torch.zeros(stop - start, e, dtype=z.dtype, device=z.device)
    eye[torch.arange(stop - start), torch.arange(start, stop)] = 1.0
    return eye[:, None, :].expand(stop - start, n, e).reshape(stop - start, *z.shape)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "ggn",
            "generalized Gauss-Newton of the reduced loss L: sum_i sum_p w_ip J_ip^T H_ip J_ip, "
            "H_ip = F_ip F_ip^T the loss's output Hessian at position p (exact: every column "
            "of F, the reduced C - 1 for softmax cross-entropy)",
            "per position p, the K columns of m_ip F_ip (K = C - 1 for cross-entropy, 1 for "
            "MSE and BCE), zero at every other position",
            "s (1/M for the mean, 1 for the sum)",
            lambda lay: lay.positions,
            lambda loss, lay: loss.factor_width(lay),
            lambda t, z, a, b: t.position_directions(z, a, b, scaled=False),
            lambda t: t.weight,
        ),
        Family(
            "empirical_fisher",
            "c sum_i g_i g_i^T, g_i = grad L_i the gradient of example i's loss "
            "L_i = (1/c) sum_p w_ip l_ip at the observed target (one example = the whole "
            "sequence or image); exact",
            "one: sum_p m_ip dl_ip/dz_ip",
            "s^2 / c",
            lambda lay: 1,
            lambda loss, lay: 1,
            lambda t, z, a, b: t.masked_gradient(z)[None],
            lambda t: t.weight * t.weight / t.scale,
        ),
        Family(
            "jacobian_gram",
            "output-Jacobian Gram c sum_i J_i^T J_i over every output entry (no loss "
            "curvature); exact",
            "the E unit directions of the output entries",
            "c (1/N for the mean, 1 for the sum)",
            lambda lay: lay.entries,
            lambda loss, lay: 1,
            _units,
            lambda t: t.scale,
        ),
    )
}


def scaled(total: torch.Tensor, a: Fraction) -> torch.Tensor:
    """``a * total`` (a division where ``a = 1/k``, so ``(1/N)`` is applied as ``/ N``)."""
    if a.numerator == 1:
        return total / a.denominator
    return total * (a.numerator / a.denominator)


@dataclass(frozen=True)
class Pulled:
    """Output directions pulled back together, and how each family's per-example rows
    ``[N, K_f, M]`` follow from their rows ``r [N, D, M]``: a slice (``spans``), or mixed by
    per-example coefficients ``[N, K_f, D]`` (``mixes``). Duck-types the ``plan`` argument of
    :func:`fathom.curvature.exact.layer_sums` (``rows``; ``units``: rows are mixed)."""

    directions: torch.Tensor
    spans: tuple[tuple[str, int, int], ...]
    mixes: tuple[tuple[str, torch.Tensor], ...] = ()

    @property
    def units(self) -> bool:
        return bool(self.mixes)

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(k for k, _, _ in self.spans) + tuple(k for k, _ in self.mixes)

    def rows(self, r: torch.Tensor, dirs: object = None) -> dict[str, torch.Tensor]:
        cut: dict[str, list[torch.Tensor]] = {}
        for k, a, b in self.spans:
            cut.setdefault(k, []).append(r[:, a:b])
        out = {k: v[0] if len(v) == 1 else torch.cat(v, 1) for k, v in cut.items()}
        if self.mixes:
            coeff = torch.cat([c for _, c in self.mixes], 1).to(r.dtype)
            mixed, at = torch.bmm(coeff, r), 0
            for k, c in self.mixes:
                out[k], at = mixed[:, at : at + c.shape[1]], at + c.shape[1]
        return out


def _mixes(families: tuple[str, ...], layout: Layout) -> bool:
    """Pull back only the units and mix the others (module docstring)."""
    small = layout.positions == 1 or layout.entries <= 64
    return "jacobian_gram" in families and len(families) > 1 and small


def mixed(families: tuple[str, ...], terms: Terms, z: torch.Tensor) -> Pulled:
    """The units, with every other family mixed from them."""
    e = terms.layout.entries
    units = FAMILIES["jacobian_gram"].directions(terms, z, 0, e)
    coeffs = []
    for k in families:
        if k != "jacobian_gram":
            fam = FAMILIES[k]
            v = fam.directions(terms, z, 0, fam.items(terms.layout))  # [K, n, *out]
            coeffs.append((k, v.reshape(v.shape[0], z.shape[0], e).transpose(0, 1)))
    return Pulled(units, (("jacobian_gram", 0, e),), tuple(coeffs))


def total_directions(families: tuple[str, ...], loss: Loss, layout: Layout) -> int:
    """Rows per example and parameter that ``families`` materialize (pulled back or mixed)."""
    return sum(FAMILIES[k].items(layout) * FAMILIES[k].width(loss, layout) for k in families)


def groups(families: tuple[str, ...], terms: Terms, z: torch.Tensor, most: int) -> Iterator[Pulled]:
    """The families' directions on ``z``, packed into groups of at most ``most`` directions
    (one item at least: a position's ``K`` columns stay together); mixed from the units
    where :func:`_mixes` says so and they fit in one group."""
    if (
        _mixes(families, terms.layout)
        and total_directions(families, terms.loss, terms.layout) <= most
    ):
        yield mixed(families, terms, z)
        return
    parts: list[torch.Tensor] = []
    spans: list[tuple[str, int, int]] = []
    size = 0
    for k in families:
        fam = FAMILIES[k]
        items, width = fam.items(terms.layout), fam.width(terms.loss, terms.layout)
        step = max(1, most // max(1, width))
        for a in range(0, items, step):
            b = min(items, a + step)
            if size and size + (b - a) * width > most:
                yield Pulled(torch.cat(parts), tuple(spans))
                parts, spans, size = [], [], 0
            v = fam.directions(terms, z, a, b)
            spans.append((k, size, size + v.shape[0]))
            parts.append(v)
            size += v.shape[0]
    if parts:
        yield Pulled(torch.cat(parts), tuple(spans))


def group_size(directions: int, examples: int, entries: int, largest: int, budget: int) -> int:
    """Directions per group so that ``directions x examples x max(parameters of the largest
    materialized layer, output entries)`` stays within ``budget`` (one at least)."""
    per = examples * max(1, largest, entries)
    return max(1, min(directions, budget // per))
