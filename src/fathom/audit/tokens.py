"""The layer-removal audit of a language model: which blocks can go, and at what cost.

A language model's reduced network (mask ``m``, :mod:`fathom.audit.masks`: bit ``l`` keeps
block ``l``, a removed block is not computed) is scored per token. On a split of ``W``
windows with targets ``y_{w,t}`` (every position valid in Fathom's windows; a target of
:data:`fathom.models.gpt.IGNORE_INDEX` is not scored), in float64::

    ce_m      = (1/M) Σ_{(w,t) valid} −log softmax(z^m_{w,t})_{y_{w,t}}     nats per token
    ppl_m     = exp(ce_m)                                                   perplexity
    damage_m  = ce_m − ce_full                                              nats per token

**Which masks.** Every mask while ``2^L <= max_masks`` (the full lattice); beyond that
budget the stated scheme :data:`_SCHEME`: the full network, every single and every pair
removal, and the greedy ordered removal (from the full network, remove the block whose
removal raises the *validation* CE least; repeat until no block is left). The coverage
(how many of the ``2^L`` masks, and which families) is recorded and printed.

**Intervals.** The split's windows are cut into ``C`` contiguous chunks (:data:`_CHUNKS`;
fewer when the split has fewer windows); chunk ``c``'s damage is its own
``ce_m(c) − ce_full(c)``. Neighbouring windows of a text are correlated; chunk means are
the batch-means device against that. A removal's damage is judged by the statistics
module's paired rule (:func:`fathom.stats.judge`: paired over the ``C`` chunks in place of
seeds, smallest effect ``rules.ce_nats``, resolution floor, Holm over the family printed
together, leave-one-chunk-out): ``equivalent`` (the interval lies inside ``±δ``) is *can
go*; ``worse`` (above ``δ``) is *cannot go*; otherwise *not established*.

**Interactions** (:mod:`fathom.audit.interactions`, in nats per token). On the full lattice,
``g = Möbius(ce)`` over the kept sets: ``g({l})`` the main effect of block ``l`` on an
otherwise empty network, ``g(T)`` for ``|T| >= 2`` the interaction; ``Σ_{T ≠ ∅} g(T) =
ce_full − ce_empty``. For any scheme (singles and pairs are always evaluated), the pair
interaction *around the full network*::

    I(l, j) = damage_{−l−j} − damage_{−l} − damage_{−j}       (0 when removals add up)

**Cost.** FLOPs per mask by torch's counter (:func:`fathom.audit.costs.mask_costs`, attention
kernels included; a kernel it cannot count is refused by name) on one window, per token
``flops_m / T``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fathom.audit.interactions import mobius, subset_orders
from fathom.audit.masks import enumerate_masks, mask_label
from fathom.depth import branch_mask
from fathom.errors import FathomError

_SCHEME = "full network, every single and pair removal, greedy ordered removal (chosen on val)"
"""The masks evaluated beyond the enumeration budget (module docstring)."""

LM_MAX_MASKS = 64
"""Every mask is evaluated while ``2^L <= 64`` (``L <= 6`` blocks): one mask costs a pass
over validation and test; beyond it, :data:`_SCHEME`."""

_CHUNKS = 20
"""Contiguous chunks of a split's windows that the damage intervals are paired over."""

SPLITS = ("val", "test")


@dataclass
class ChunkedCE:
    """Per-mask, per-chunk summed token CE and token counts of one split (float64).

    ``sums[label]`` is ``[C]`` (Σ of −log p over the valid tokens of each chunk),
    ``tokens`` ``[C]`` the valid tokens per chunk.
    """

    tokens: np.ndarray
    sums: dict[str, np.ndarray] = field(default_factory=dict)

    def ce(self, label: str) -> float:
        """``ce_m`` (nats per token) over the whole split."""
        return float(self.sums[label].sum() / self.tokens.sum())

    def chunk_ce(self, label: str) -> np.ndarray:
        """``ce_m(c)`` per chunk, nats per token ``[C]``."""
        return self.sums[label] / self.tokens


def chunk_bounds(windows: int, chunks: int = _CHUNKS) -> np.ndarray:
    """Start indices (and the end) of ``min(chunks, windows)`` contiguous, near-equal chunks."""
    if windows < 1:
        raise FathomError("the split holds no window; a language model's audit needs text")
    c = min(chunks, windows)
    return np.linspace(0, windows, c + 1).round().astype(np.int64)


@torch.no_grad()
def _window_ce_sums(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, mask: tuple[int, ...], batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per window: summed token CE (float64, nats) and valid-token count under ``mask``.

    Dense evaluation, kept blocks at gain one, removed blocks not computed
    (:func:`fathom.depth.branch_mask`); the model must return ``[N, T, V]`` logits.
    """
    from fathom.models.gpt import IGNORE_INDEX

    sums, counts = [], []
    with branch_mask(model, mask):
        for s in range(0, x.shape[0], batch_size):
            xb, yb = x[s : s + batch_size], y[s : s + batch_size]
            z = model(xb)
            if not isinstance(z, torch.Tensor) or z.dim() != 3 or z.shape[:2] != yb.shape:
                got = list(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
                raise FathomError(
                    f"the model returned {got} for windows {list(xb.shape)}; a language model's "
                    "audit needs next-token logits [N, T, V]"
                )
            logp = torch.log_softmax(z.double(), dim=-1)
            valid = yb != IGNORE_INDEX
            tgt = yb.clamp_min(0).long()
            nll = -logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) * valid
            # note: this is a CPU-GPU sync point (once per batch per mask)
            sums.append(nll.sum(dim=1).cpu().numpy())
            counts.append(valid.sum(dim=1).cpu().numpy())
    return np.concatenate(sums), np.concatenate(counts)


class MaskEvaluator:
    """Evaluates masks on the splits once each (a cache), as chunked token CE."""

    def __init__(
        self,
        model: nn.Module,
        splits: dict[str, tuple[torch.Tensor, torch.Tensor]],
        batch_size: int = 256,
        chunks: int = _CHUNKS,
        on_mask: Callable[[], None] | None = None,
    ) -> None:
        self.model, self.splits, self.batch_size = model, splits, batch_size
        self.bounds = {n: chunk_bounds(x.shape[0], chunks) for n, (x, _) in splits.items()}
        self.scores: dict[str, ChunkedCE] = {}
        self.order: list[str] = []
        self.on_mask = on_mask

    def _chunked(self, per_window: np.ndarray, name: str) -> np.ndarray:
        b = self.bounds[name]
        return np.add.reduceat(per_window.astype(np.float64), b[:-1])

    def evaluate(self, mask: tuple[int, ...]) -> str:
        """Score ``mask`` on every split (once); its label."""
        label = mask_label(mask)
        if label in self.order:
            return label
        for name, (x, y) in self.splits.items():
            sums, counts = _window_ce_sums(self.model, x, y, mask, self.batch_size)
            if name not in self.scores:
                self.scores[name] = ChunkedCE(tokens=self._chunked(counts, name))
            self.scores[name].sums[label] = self._chunked(sums, name)
        self.order.append(label)
        if self.on_mask is not None:
            self.on_mask()
        return label


def _without(full: tuple[int, ...], removed: set[int]) -> tuple[int, ...]:
    return tuple(0 if i in removed else b for i, b in enumerate(full))


def _greedy_path(ev: MaskEvaluator, layers: int) -> list[dict[str, Any]]:
    """Greedy ordered removal on validation CE (module docstring): one step per block.

    Step ``j`` removes, from the blocks still kept, the one whose removal gives the lowest
    validation ``ce``; ties go to the lower block index. Returns ``[{step, removed (block),
    mask}]`` for ``j = 1 .. L``.
    """
    full = (1,) * layers
    removed: set[int] = set()
    path = []
    for step in range(1, layers + 1):
        best: tuple[float, int, str] | None = None
        for b in range(layers):
            if b in removed:
                continue
            label = ev.evaluate(_without(full, removed | {b}))
            key = (ev.scores["val"].ce(label), b, label)
            if best is None or key[:2] < best[:2]:
                best = key
        assert best is not None
        removed.add(best[1])
        path.append({"step": step, "removed": best[1], "mask": best[2]})
    return path


def plan_and_evaluate(ev: MaskEvaluator, layers: int, max_masks: int) -> dict[str, Any]:
    """Every mask (``2^L <= max_masks``) or :data:`_SCHEME`; returns the coverage record and
    the greedy path (always computed: on the full lattice it reads cached scores)."""
    total = 1 << layers
    full = (1,) * layers
    if total <= max_masks:
        for row in enumerate_masks(layers, max_masks=total):
            ev.evaluate(tuple(int(b) for b in row))
        scheme = "every mask"
    else:
        ev.evaluate(full)
        for b in range(layers):
            ev.evaluate(_without(full, {b}))
        for b in range(layers):
            for j in range(b + 1, layers):
                ev.evaluate(_without(full, {b, j}))
        scheme = _SCHEME
    path = _greedy_path(ev, layers)
    n = len(ev.order)
    coverage = {
        "scheme": scheme,
        "enumerated": total <= max_masks,
        "max_masks": max_masks,
        "masks_evaluated": n,
        "masks_total": total,
        "fraction": n / total,
        "text": (
            f"{n} of {total} masks ({scheme}"
            + ("" if total <= max_masks else f"; 2^{layers} > budget {max_masks}")
            + ")"
        ),
    }
    return {"coverage": coverage, "greedy": path}


def planned_masks(layers: int, max_masks: int) -> int:
    """How many masks :func:`plan_and_evaluate` evaluates: ``2^L`` within the budget, else
    ``1 + L + L(L−1)/2`` plus the greedy steps' new masks ``(L−2) + ... + 1``."""
    if (1 << layers) <= max_masks:
        return 1 << layers
    return 1 + layers + layers * (layers - 1) // 2 + (layers - 2) * (layers - 1) // 2


def pair_interactions(damage: dict[str, float], layers: int) -> list[dict[str, Any]]:
    """``I(l, j) = damage_{−l−j} − damage_{−l} − damage_{−j}`` (nats per token) for every pair."""
    full = (1,) * layers
    out = []
    for b in range(layers):
        for j in range(b + 1, layers):
            both = damage[mask_label(_without(full, {b, j}))]
            one, two = (
                damage[mask_label(_without(full, {b}))],
                damage[mask_label(_without(full, {j}))],
            )
            out.append({"blocks": [b, j], "interaction": both - one - two})
    return out


def lattice_interactions(ce: dict[str, float], layers: int) -> dict[str, Any]:
    """Möbius coefficients of ``ce`` over the kept sets (full lattice only), in nats per token:
    the main effects ``g({l})``, every ``g(T)`` with its blocks, and ``Σ g`` and ``Σ |g|`` by
    order ``|T|``."""
    rows = enumerate_masks(layers, max_masks=1 << layers)
    f = np.array([ce[mask_label(r)] for r in rows])
    g = mobius(f)
    order = subset_orders(layers)
    return {
        "empty_ce": float(g[0]),
        "main_effects": [float(g[1 << b]) for b in range(layers)],
        "coefficients": [
            {"blocks": [b for b in range(layers) if (t >> b) & 1], "g": float(g[t])}
            for t in range(1, 1 << layers)
        ],
        "sum_by_order": [float(g[order == r].sum()) for r in range(layers + 1)],
        "abs_by_order": [float(np.abs(g[order == r]).sum()) for r in range(layers + 1)],
    }
