"""What the audit needs from a run directory, for every kind of run it can read.

A *subject* is one run directory seen by the audit: its model at a checkpoint (input
preparation included, so the model takes the split's stored examples), its data splits
(re-derived and checked against the recorded split hash), its arm family, its seed, and
whether it has any :class:`fathom.depth.SkippableResidual` branch to remove. Kinds:

every run is of manifest kind ``run``, its model rebuilt by ``model.kind``
(:func:`fathom.models.build_model`, input preparation included):

* the Ciresan MLP (``fathom train``, ``fathom study run``): family = recipe;
* a depth-scaling run (``fathom depth-scaling``, :class:`fathom.models.convnet.StagedConvNet`,
  ANN or spiking): family = ``staged_conv-<arm>-d<depth>``; removable only when trained
  with ``residual = true``;
* a user's ``python`` model: removable when it has SkippableResidual branches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fathom.config.model_kinds import model_kind
from fathom.depth import SkippableResidual
from fathom.errors import FathomError
from fathom.rundir import RunDir, Which


@dataclass(frozen=True)
class Subject:
    """One run directory as the audit sees it (module docstring)."""

    rd: RunDir
    kind: str
    family: str
    seed: int
    classes: int
    removable_reason: str | None  # None when the model has branches to remove
    tokens: bool = False  # a language model ([N, T, V] logits): audited per token

    def load_model(self, which: Which, device: torch.device) -> nn.Module:
        """The hash-verified model at checkpoint ``which``, float32, in eval mode."""
        return self.rd.load_model(which, dtype=torch.float32, device=device)

    def load_splits(self, device: torch.device) -> Any:
        """The run's splits, re-derived and checked against the recorded split hash."""
        return self.rd.load_splits(device)

    @property
    def config_for_digest(self) -> dict[str, Any]:
        """The run's config without seed and name (what makes two arms differ)."""
        cfg = dict(self.rd.header.config)
        cfg.pop("seed", None)
        cfg.pop("name", None)
        return cfg


def _family(cfg: Any) -> str:
    """The model kind's audit label (its row's ``label``): Ciresan, the recipe; a
    depth-scaling run, ``staged_conv-<arm>-d<depth>``; a user's model, ``python-<factory>``."""
    return model_kind(cfg.model.kind).label(cfg.model, cfg.tags)


def subject_of(rd: RunDir) -> Subject:
    """The subject of a run directory (any model kind); other manifest kinds refused."""
    if rd.kind != "run":
        raise FathomError(
            f"run {rd.run_id!r} has manifest kind {rd.kind!r}; the audit reads runs trained by "
            "`fathom train`, `fathom study run` and `fathom depth-scaling` (kind 'run')"
        )
    cfg = rd.config
    reason = None
    if not any(isinstance(m, SkippableResidual) for m in rd.build_model().modules()):
        why = model_kind(cfg.model.kind).no_branches(cfg.model)
        reason = (
            f"its model ({_family(cfg)}) has no removable branches (no SkippableResidual "
            "branch); audit a residual recipe (or a depth-scaling run with --residual)"
            if why is None
            else f"its model ({_family(cfg)}) has no removable branches: {why}"
        )
    tokens = model_kind(cfg.model.kind).tokens
    return Subject(rd, "run", _family(cfg), cfg.seed, rd.classes, reason, tokens)
