"""Audit of one model checkpoint: every table that needs only the model and its splits.

The result is a plain JSON-able dict; per-example arrays go to a compressed ``.npz``
(:func:`fathom.audit.evaluate.save_scores`) so later analyses need no model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fathom.audit.costs import mask_macs
from fathom.audit.evaluate import MaskScores, evaluate_masks, save_scores
from fathom.audit.interactions import energy_by_order, interaction_fraction
from fathom.audit.masks import (
    MAX_ENUMERATED_MASKS,
    enumerate_masks,
    full_mask_index,
    is_full_lattice,
    mask_label,
    removable_branch_count,
    sample_masks,
)
from fathom.audit.resilience import class_resilience, contrast_population, fit_margin_bins
from fathom.audit.resilience import resilience_per_example as per_example_resilience
from fathom.audit.router import (
    cheapest_within_tolerance,
    compare_with_control,
    fit_router,
    pooled_features,
    score_policy,
)
from fathom.audit.speed import time_routed
from fathom.audit.tokens import LM_MAX_MASKS
from fathom.data.registry import default_contrast
from fathom.errors import FathomError
from fathom.losses.labels import LabelLoss


@dataclass(frozen=True)
class AuditSettings:
    """Every choice of an audit; recorded verbatim in ``audit.json``."""

    checkpoints: tuple[str, ...] = ("selected",)
    max_masks: int = MAX_ENUMERATED_MASKS
    token_max_masks: int = LM_MAX_MASKS  # a language model's enumeration budget
    sample_masks: int | None = None
    keep: int | None = None
    contrast_a: int | None = None  # None: the default contrast (contrast_for)
    contrast_b: tuple[int, ...] | None = None
    margin_bins: int = 5
    router: bool = True
    tolerance: float = 0.005
    tree_depth: int = 3
    min_samples_leaf: int = 50
    n_permutations: int = 1000
    alpha: float = 0.05
    timing_batch_sizes: tuple[int, ...] = (1, 256)
    timing_repeats: int = 7
    routed_timing_examples: int = 2048
    routed_timing_repeats: int = 3
    eval_batch_size: int = 2000
    seed: int = 0
    device: str = "cpu"

    def keep_for(self, k: int) -> int:
        """Mask size of the resilience masks: ``keep`` or ``k // 2`` (two of four)."""
        return k // 2 if self.keep is None else self.keep

    def contrast_for(
        self, classes: int, dataset: str | None = None
    ) -> tuple[int, tuple[int, ...], str]:
        """``(a, B, source)`` of the class contrast: the one given, else the registered
        dataset's own (:func:`fathom.data.registry.default_contrast`: MNIST's digit ``1`` vs
        ``{4, 9}``), else class 0 vs every other class (a default that exists on any data of
        >= 2 classes; a digit contrast on other 10-class data would name arbitrary classes)."""
        if self.contrast_a is not None:
            return self.contrast_a, tuple(self.contrast_b or ()), "given (--contrast)"
        own = default_contrast(dataset)
        if own is not None and max(own[0], *own[1]) < classes:
            a, b = own
            return a, b, f"default for {dataset} ({a} vs {', '.join(map(str, b))})"
        rest = tuple(range(1, classes))
        return 0, rest, f"default for {classes} classes (class 0 vs every other class)"

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def choose_masks(k: int, settings: AuditSettings) -> np.ndarray:
    """All ``2^k`` masks, or ``settings.sample_masks`` sampled ones (never both)."""
    if settings.sample_masks is not None:
        return sample_masks(k, settings.sample_masks, settings.seed)
    return enumerate_masks(k, settings.max_masks)


def _split_table(s: MaskScores) -> list[dict[str, float]]:
    """Per mask: ``acc``, ``ce``, ``damage`` (the loss's: :meth:`MaskScores.damage`) and,
    under a loss other than plain cross-entropy, ``loss`` (``L_m``)."""
    acc, ce, dmg = s.accuracy(), s.mean_ce(), s.damage()
    rows = [{"acc": float(a), "ce": float(c), "damage": float(d)} for a, c, d in zip(acc, ce, dmg)]
    loss = s.mean_loss()
    if loss is not None:
        for row, value in zip(rows, loss):
            row["loss"] = float(value)
    return rows


def _mean_of(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}


def _mask_tables(
    masks: np.ndarray, macs: list[int], scores: dict[str, MaskScores], branch_macs: list[int]
) -> dict[str, Any]:
    """Per-mask rows, means over masks of each size, and single-deletion rows per branch."""
    full = full_mask_index(masks)
    k = masks.shape[1]
    per_split = {name: _split_table(s) for name, s in scores.items()}
    rows = []
    for m, row in enumerate(masks):
        entry: dict[str, Any] = {
            "mask": mask_label(row),
            "kept": int(row.sum()),
            "macs": macs[m],
            "macs_fraction": macs[m] / macs[full],
        }
        for name, table in per_split.items():
            entry[name] = table[m]
        rows.append(entry)
    sizes = masks.sum(axis=1)
    by_size = {}
    for s in range(k + 1):
        chosen = np.flatnonzero(sizes == s)
        if chosen.size == 0:
            continue
        item: dict[str, Any] = {"n_masks": int(chosen.size)}
        for name, table in per_split.items():
            item[name] = _mean_of([table[m] for m in chosen])
        by_size[str(s)] = item
    label_to_index = {mask_label(r): m for m, r in enumerate(masks)}
    branches = []
    for b in range(k):
        single = mask_label([0 if j == b else 1 for j in range(k)])
        m = label_to_index.get(single)
        entry = {
            "branch": b,
            "mask": single,
            "branch_macs": branch_macs[b],
            "branch_macs_fraction": branch_macs[b] / macs[full],
        }
        for name, table in per_split.items():
            entry[name] = None if m is None else table[m]
        branches.append(entry)
    return {
        "full_mask": mask_label(masks[full]),
        "masks": rows,
        "by_size": by_size,
        "branches": branches,
    }


def _interaction_summary(masks: np.ndarray, s: MaskScores) -> dict[str, Any]:
    """Mean, median and count of defined per-example interaction fractions; energy by order."""
    if not is_full_lattice(masks):
        return {"defined": False, "reason": "interactions need all 2^k masks; masks were sampled"}
    rho = interaction_fraction(s.logits)
    ok = rho[~np.isnan(rho)]
    energy = energy_by_order(s.logits)
    return {
        "defined": bool(ok.size),
        "mean_fraction": float(ok.mean()) if ok.size else None,
        "median_fraction": float(np.median(ok)) if ok.size else None,
        "examples_defined": int(ok.size),
        "examples_constant": int(rho.size - ok.size),
        "energy_by_order": energy.tolist(),
    }


def _resilience_summary(
    masks: np.ndarray,
    scores: dict[str, MaskScores],
    settings: AuditSettings,
    classes: int,
    dataset: str | None = None,
) -> dict[str, Any]:
    """Class resilience on val and test with margin bins fixed on validation."""
    keep = settings.keep_for(masks.shape[1])
    a, b, source = settings.contrast_for(classes, dataset)
    full = full_mask_index(masks)
    per = {name: per_example_resilience(s.correct, masks, full, keep) for name, s in scores.items()}
    val = scores["val"]
    pop = contrast_population(per["val"], val.labels, a, b)
    n_pop = int(pop.sum())
    bins = None
    out: dict[str, Any] = {
        "keep": keep,
        "n_masks": int((masks.sum(axis=1) == keep).sum()),
        "contrast": {"a": a, "b": list(b), "source": source},
        "margin_bins": None,
    }
    if n_pop >= settings.margin_bins:
        bins = fit_margin_bins(val.margin[full][pop], settings.margin_bins)
        out["margin_bins"] = bins.to_dict()
    else:  # e.g. an untrained model: the standardized contrast is undefined, not an error
        out["margin_bins_undefined"] = (
            f"{n_pop} full-correct validation examples of the contrast classes cannot fill "
            f"{settings.margin_bins} margin bins; standardized contrasts are null"
        )
    for name, s in scores.items():
        res = class_resilience(per[name], s.margin[full], s.labels, classes, a, b, bins)
        out[name] = res.to_dict()
    return out


def _routing_summary(
    model: nn.Module,
    masks: np.ndarray,
    macs: list[int],
    scores: dict[str, MaskScores],
    val_x: torch.Tensor,
    test_x: torch.Tensor,
    settings: AuditSettings,
) -> dict[str, Any]:
    """Router fitted and calibrated on validation, scored on test against its control."""
    full = full_mask_index(masks)
    costs = np.asarray(macs, dtype=np.float64)
    router = fit_router(
        pooled_features(val_x),
        scores["val"].correct,
        costs,
        full,
        settings.tolerance,
        max_depth=settings.tree_depth,
        min_samples_leaf=settings.min_samples_leaf,
        seed=settings.seed,
    )
    test = scores["test"]
    assign = router.assign(pooled_features(test_x))
    outcome = score_policy(test.correct, assign, costs, full, settings.tolerance)
    control = compare_with_control(
        test.correct, assign, settings.n_permutations, settings.seed, settings.alpha
    )
    static = cheapest_within_tolerance(scores["val"].correct, costs, full, settings.tolerance)
    static_outcome = score_policy(
        test.correct, np.full(test.labels.shape[0], static), costs, full, settings.tolerance
    )
    n_time = min(settings.routed_timing_examples, test_x.shape[0])
    x_time = test_x[:n_time]
    timing = time_routed(
        model,
        x_time,
        lambda xb: router.assign(pooled_features(xb)),
        masks,
        batch_size=max(settings.timing_batch_sizes),
        repeats=settings.routed_timing_repeats,
    )
    labels = [mask_label(r) for r in masks]
    return {
        "features": "7x7 average-pooled pixel intensities per channel, no labels, no model output",
        "tree": router.describe(),
        "leaf_masks": {k: labels[v] for k, v in router.describe()["leaf_masks"].items()},
        "test": outcome.to_dict(),
        "control": control.to_dict(),
        "static": {
            "mask": labels[static],
            "chosen_on": "all validation examples",
            "test": static_outcome.to_dict(),
        },
        "timing": timing.to_dict(),
    }


def audit_checkpoint(
    model: nn.Module,
    splits: Any,
    settings: AuditSettings,
    arrays_path: Path,
    meta: dict[str, str],
    on_mask: Callable[[int, int], None] | None = None,
    loss: LabelLoss | None = None,
    classes: int | None = None,
    dataset: str | None = None,
) -> dict[str, Any]:
    """All per-checkpoint tables for ``model`` (eval mode) on ``splits.val_*``/``test_*``.

    ``on_mask(done, total)`` is called after each mask pass (``total``: the masks, once on
    validation and once on test). ``loss``: the loss damage is measured in (the run's
    ``[loss]``; ``None``: plain cross-entropy), recorded as ``record["loss"]``. ``classes``:
    the class count of the run's data (:attr:`fathom.rundir.RunDir.classes`), which the
    per-class resilience and the default contrast are over; ``None`` (a model outside a run
    directory): the width of its logits. A model whose logits have another width than the
    data's classes is refused. ``dataset``: the registered dataset's name, whose own class
    contrast is the default (:meth:`AuditSettings.contrast_for`)."""
    k = removable_branch_count(model)
    if splits.val_y.shape[0] == 0 or splits.test_y.shape[0] == 0:
        raise FathomError(
            "the run has no validation or no test examples (split 'fit-all' or an empty subset); "
            "the audit fixes margin bins and calibrates the router on validation and reports on "
            "test: audit a run trained with split 'fit-val'"
        )
    masks = choose_masks(k, settings)
    macs = mask_macs(model, masks, splits.val_x)
    full = full_mask_index(masks)
    singles = np.ones((k, k), dtype=np.uint8) - np.eye(k, dtype=np.uint8)
    branch_macs = [macs[full] - m for m in mask_macs(model, singles, splits.val_x)]
    bs = settings.eval_batch_size
    passes = [0]

    def tick() -> None:
        passes[0] += 1
        if on_mask is not None:
            on_mask(passes[0], 2 * len(masks))

    scores = {
        "val": evaluate_masks(model, splits.val_x, splits.val_y, masks, bs, tick, loss=loss),
        "test": evaluate_masks(model, splits.test_x, splits.test_y, masks, bs, tick, loss=loss),
    }
    save_scores(str(arrays_path), scores, meta)
    width = int(scores["test"].logits.shape[2])
    if classes is not None and classes != width:
        raise FathomError(
            f"the model outputs {width} logits per example but the run's data has {classes} "
            "classes (data.info.classes): the per-class resilience is over the data's classes; "
            f"audit a model whose output has one logit per class ({classes})"
        )
    classes = width if classes is None else classes
    record: dict[str, Any] = {"k": k, "enumerated": settings.sample_masks is None}
    if loss is not None and not loss.is_default:
        record["loss"] = loss.record()
    record.update(_mask_tables(masks, macs, scores, branch_macs))
    record["interactions"] = {name: _interaction_summary(masks, s) for name, s in scores.items()}
    record["resilience"] = _resilience_summary(masks, scores, settings, classes, dataset)
    if settings.router:
        record["routing"] = _routing_summary(
            model, masks, macs, scores, splits.val_x, splits.test_x, settings
        )
    else:
        record["routing"] = None
    return record
