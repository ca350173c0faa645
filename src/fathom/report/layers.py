"""Which layers of different recipes are the same network layer: the one alignment.

Recipes name the same layer differently (a plain block's linear is ``blocks.0.res``, a
residual recipe's ``blocks.0.res.branch``). Every run's manifest lists its instrumented
layers in model order (``telemetry.layers[i].name``, written by the seam); the *position*
``i`` in that list is the layer's identity across recipes. A position is labelled by the
names found there, first-seen over the runs given (reference recipe first), joined by
``" / "``: ``"blocks.0.res.branch / blocks.0.res"``, or just ``"head"`` when every recipe
agrees. A run whose manifest has no layer list (an older or hand-made run) is matched by
name only: its layer joins the position that holds the same name in another run, else a
label of its own. Positions only mean the same layer in models of one depth: when the
listed runs' layer lists differ in length (a depth-scaling study), every run is matched
by name only. Every per-layer view (curve small multiples, cross-run tables) goes
through :class:`LayerAlignment`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LayerAlignment:
    """``labels``: one per aligned layer, in model order (unlisted names after);
    ``by_run[run_id][name] -> label``; ``names[label][run_id] -> name``."""

    labels: list[str] = field(default_factory=list)
    by_run: dict[str, dict[str, str]] = field(default_factory=dict)
    names: dict[str, dict[str, str]] = field(default_factory=dict)

    def label(self, run_id: str, name: str) -> str:
        """The aligned label of layer ``name`` of run ``run_id`` (the name if unknown)."""
        return self.by_run.get(run_id, {}).get(name, name)

    def last(self) -> str | None:
        """The label of the last listed layer (the output layer), or None."""
        return self.labels[-1] if self.labels else None


def align_layers(
    runs: Sequence[Any], extra: Mapping[str, Sequence[str]] | None = None
) -> LayerAlignment:
    """The alignment of ``runs`` (:class:`~fathom.report.runs.RunData`: ``run_id`` and the
    ``recorded`` manifest's ``telemetry.layers``; order matters for labels). ``extra[run_id]``: layer names a run records beyond (or without) its
    manifest list, e.g. from its history, matched by name."""
    listed = {r.run_id: r.recorded.telemetry.layer_names for r in runs}
    if len({len(v) for v in listed.values() if v}) > 1:  # different depths: names only
        extra = {
            r.run_id: [*(listed[r.run_id] or []), *(extra or {}).get(r.run_id, ())] for r in runs
        }
        listed = dict.fromkeys(listed)
    width = max((len(v) for v in listed.values() if v), default=0)
    at: list[list[str]] = [[] for _ in range(width)]
    for names in listed.values():
        for i, n in enumerate(names or []):
            if n not in at[i]:
                at[i].append(n)
    labels = [" / ".join(ns) for ns in at]
    out = LayerAlignment(labels=list(labels))
    by_name: dict[str, str] = {}
    for i, ns in enumerate(at):
        for n in ns:
            by_name.setdefault(n, labels[i])
    for r in runs:
        own: dict[str, str] = {}
        for i, n in enumerate(listed[r.run_id] or []):
            own[n] = labels[i]
        for n in (extra or {}).get(r.run_id, ()):
            if n not in own:
                own[n] = by_name.get(n, n)
                if own[n] not in out.labels:
                    out.labels.append(own[n])
        out.by_run[r.run_id] = own
        for n, lab in own.items():
            out.names.setdefault(lab, {})[r.run_id] = n
    return out


def output_label(labels: Sequence[str]) -> str | None:
    """The aligned label of the output layer among ``labels`` (in model order): ``head`` if a
    label is named so, else the last; None when there is none."""
    return "head" if "head" in labels else (labels[-1] if labels else None)
