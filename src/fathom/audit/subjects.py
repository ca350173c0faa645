"""What the audit needs from a run directory, for every kind of run it can read.

A *subject* is one run directory seen by the audit: its model at a checkpoint (input
preparation included, so the model takes the split's stored examples), its data splits
(re-derived and checked against the recorded split hash), its arm family, its seed, and
whether it has any :class:`fathom.depth.SkippableResidual` branch to remove. Kinds:

* ``run`` (``fathom train``, the Ciresan MLP): family = recipe;
* ``depth_scaling`` (``fathom depth-scaling``, :class:`fathom.models.convnet.StagedConvNet`,
  ANN or spiking): family = ``staged_conv-<arm>-d<depth>``; the model is
  ``Sequential(ImagePrep(dataset), net)`` (padding to 32×32 and normalisation, exactly as
  the run evaluated it). Removable only when the run was trained with ``residual = true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fathom.errors import FathomError
from fathom.rundir import RunDir, Which
from fathom.train.checkpoint import load_cpu_state

DEPTH_SCALING_RUN_KEYS = ("depth", "arm", "seed", "lyap_reg")


@dataclass(frozen=True)
class Subject:
    """One run directory as the audit sees it (module docstring)."""

    rd: RunDir
    kind: str
    family: str
    seed: int
    classes: int
    removable_reason: str | None  # None when the model has branches to remove

    def load_model(self, which: Which, device: torch.device) -> nn.Module:
        """The hash-verified model at checkpoint ``which``, float32, in eval mode."""
        if self.kind == "depth_scaling":
            from fathom.depthscale.data import ImagePrep
            from fathom.depthscale.runner import build_model

            cfg, depth = _depth_scaling_config(self.rd)
            net = build_model(cfg, depth, self.classes)
            load_cpu_state(net, self.rd.load_state(which))
            return nn.Sequential(ImagePrep(cfg.dataset), net).to(device).eval()
        return self.rd.load_model(which, dtype=torch.float32, device=device)

    def load_splits(self, device: torch.device) -> Any:
        """The run's splits, re-derived and checked against the recorded split hash."""
        if self.kind != "depth_scaling":
            return self.rd.load_splits(device)
        from fathom.depthscale.runner import load_splits

        cfg, _ = _depth_scaling_config(self.rd)
        splits, _ = load_splits(cfg, device)
        recorded = self.rd.manifest.get("data", {}).get("split_hash")
        if recorded is not None and recorded != splits.split_hash:
            raise FathomError(
                f"the data splits of run {self.rd.run_id!r} no longer match: recorded split "
                f"hash {recorded}, re-derived {splits.split_hash}"
            )
        return splits

    @property
    def config_for_digest(self) -> dict[str, Any]:
        """The run's config without seed and name (what makes two arms differ)."""
        cfg = dict(self.rd.manifest.get("config", {}))
        cfg.pop("seed", None)
        cfg.pop("name", None)
        return cfg


def _depth_scaling_config(rd: RunDir):
    from fathom.depthscale.config import DepthScaleConfig

    raw = dict(rd.manifest.get("config", {}))
    depth = int(raw["depth"])
    values = {k: v for k, v in raw.items() if k not in DEPTH_SCALING_RUN_KEYS}
    return DepthScaleConfig.model_validate(values), depth


def subject_of(rd: RunDir) -> Subject:
    """The subject of a run directory, by its manifest's ``kind``; unknown kinds refused."""
    kind = rd.manifest.get("kind", "run")
    if kind == "depth_scaling":
        raw = rd.manifest.get("config", {})
        try:
            family = f"staged_conv-{str(raw['arm']).lower()}-d{int(raw['depth'])}"
            seed = int(raw["seed"])
        except (KeyError, TypeError, ValueError):
            raise FathomError(
                f"run {rd.run_id!r}: its depth-scaling manifest lacks depth, arm or seed"
            ) from None
        reason = None
        if not raw.get("residual", False):
            reason = (
                "its staged conv net was trained with residual = false, so no block has a "
                "SkippableResidual branch; audit a depth-scaling run with --residual"
            )
        classes = int(rd.manifest.get("data", {}).get("classes", 10))
        return Subject(rd, kind, family, seed, classes, reason)
    from fathom.models.ciresan import recipe_spec

    try:
        recipe = rd.config.model.recipe
    except FathomError as e:
        raise FathomError(
            f"run {rd.run_id!r} (manifest kind {kind!r}): the audit rebuilds models of "
            f"`fathom train` and `fathom depth-scaling` runs, and this config does not read as "
            f"either ({e})"
        ) from None
    reason = None
    if not recipe_spec(recipe).residual:
        reason = (
            f"recipe {recipe!r} has no removable branches (its blocks have no bypass); "
            "audit a residual recipe"
        )
    classes = int(rd.manifest.get("data", {}).get("info", {}).get("classes", 10))
    return Subject(rd, "run", recipe, rd.config.seed, classes, reason)
