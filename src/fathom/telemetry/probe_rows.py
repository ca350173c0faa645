"""Per-layer probe rows of :class:`fathom.Instruments`: activation and backprop summaries
from a layer's recorded calls (example dimension first, every other entry a unit)."""

from __future__ import annotations

from typing import Any

import torch

from fathom.seam import Call
from fathom.telemetry.distributions import activation_summary, entry_summary

Value = float | int | None | list


def first_input(leaves: list[Any]) -> torch.Tensor | None:
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


def activation_row(name: str, calls: list[Call], n: int) -> dict[str, Value]:
    parts = []
    for call in calls:
        leaves = call.input_leaves()
        j = _first_index(leaves)
        if j is not None:
            parts.append(_per_example_rows(leaves[j], call.in_dims[j], n))
    h = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)) if parts else torch.empty(0)
    return {f"probe/act/{key}/{name}": v for key, v in activation_summary(h).items()}


def delta_row(name: str, calls: list[Call], cots: list, n: int) -> dict[str, Value]:
    parts = []
    for call, cot in zip(calls, cots, strict=True):
        j = next((j for j, t in enumerate(cot) if t is not None), None)
        if j is not None:
            parts.append(_per_example_rows(cot[j], call.out_dims[j], n))
    d = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)) if parts else torch.empty(0)
    return {f"probe/delta/{key}/{name}": v for key, v in entry_summary(d).items()}
