"""Every mask on one split: logits, correctness, margins, accuracy, CE and deletion damage.

For mask ``m`` and example ``i`` with logits ``z_mi`` and label ``y_i`` (all in float64)::

    correct_mi = [argmax_c z_mic == y_i]
    ce_mi      = -log softmax(z_mi)_{y_i}                         (nats)
    margin_mi  = z_mi,y_i - max_{c != y_i} z_mic                  (> 0 iff correct, ties aside)
    acc_m      = mean_i correct_mi,   ce_m = mean_i ce_mi
    damage_m   = ce_m - ce_full                                   (ΔCE against the same model's
                                                                   full output, nats)

Under another loss (``loss=`` here, a run's ``[loss]`` table in ``fathom audit``;
:class:`fathom.losses.labels.LabelLoss`) the damage is that loss's: with ``L_mi`` example
``i``'s loss under mask ``m`` (:meth:`~fathom.losses.labels.LabelLoss.example_losses`,
float64 from the stored logits) and ``L_m = c sum_i L_mi`` the split's loss (``c = 1/N`` for
the mean, ``1`` for the sum), ``damage_m = L_m - L_full``; ``ce_m`` and the accuracy stay as
above. Plain cross-entropy with the mean is the formula above itself.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fathom.audit.labelled import PerMask
from fathom.audit.masks import full_mask_index
from fathom.base.io import atomic_write_bytes
from fathom.depth import branch_mask, dense_eval, state_kept
from fathom.errors import FathomError

if TYPE_CHECKING:
    from fathom.losses.kinds import Loss
    from fathom.losses.labels import LabelLoss


@dataclass(frozen=True)
class MaskScores:
    """Per-example arrays for every mask of one split (rows follow ``masks``).

    ``logits`` float32 ``[M, N, C]``; ``correct`` bool ``[M, N]``; ``margin`` and ``ce``
    float64 ``[M, N]``; ``labels`` int64 ``[N]``; ``masks`` uint8 ``[M, k]``. Under a loss
    other than plain cross-entropy (module docstring), ``loss`` holds it and ``losses`` its
    per-example ``L_mi`` float64 ``[M, N]``; both ``None`` otherwise.
    """

    masks: np.ndarray
    labels: np.ndarray
    logits: np.ndarray
    correct: np.ndarray
    margin: np.ndarray
    ce: np.ndarray
    loss: LabelLoss | None = None
    losses: np.ndarray | None = None

    @property
    def full(self) -> int:
        return full_mask_index(self.masks)

    def accuracy(self) -> PerMask:
        """``acc_m`` for every mask, ``[M]`` (fractions), labelled by mask (:class:`PerMask`)."""
        return PerMask.of(self.correct.mean(axis=1), self.masks, self.full, "accuracy")

    def mean_ce(self) -> PerMask:
        """``ce_m`` for every mask, ``[M]`` (nats), labelled by mask."""
        return PerMask.of(self.ce.mean(axis=1), self.masks, self.full, "mean CE")

    def mean_loss(self) -> PerMask | None:
        """``L_m`` for every mask, ``[M]`` (module docstring), labelled by mask; ``None`` under
        plain cross-entropy (then :meth:`mean_ce` is the loss)."""
        if self.loss is None or self.losses is None:
            return None
        per = self.losses.mean(axis=1) if self.loss.loss.reduction == "mean" else self.losses.sum(1)
        return PerMask.of(per, self.masks, self.full, "loss")

    def damage(self) -> PerMask:
        """``damage_m = ce_m - ce_full`` for every mask, ``[M]`` (nats; 0 for the full mask),
        labelled by mask; under another loss ``L_m - L_full`` (module docstring)."""
        per = self.mean_loss()
        if per is not None:
            values = np.asarray(per)
            return PerMask.of(values - values[self.full], self.masks, self.full, "loss damage")
        ce = self.ce.mean(axis=1)
        return PerMask.of(ce - ce[self.full], self.masks, self.full, "CE damage")

    def with_loss(self, loss: LabelLoss | None) -> MaskScores:
        """These scores with ``L_mi`` of ``loss`` from the stored logits (``None`` or plain
        cross-entropy: unchanged)."""
        if loss is None or loss.is_default:
            return self
        y = torch.from_numpy(self.labels)
        per = [loss.example_losses(torch.from_numpy(z), y)[0].numpy() for z in self.logits]
        return replace(self, loss=loss, losses=np.stack(per))


def scores_from_logits(logits: np.ndarray, labels: np.ndarray, masks: np.ndarray) -> MaskScores:
    """Correctness, margins and CE (module formulas) from logits ``[M, N, C]``."""
    if logits.ndim != 3 or logits.shape[0] != masks.shape[0] or logits.shape[1] != labels.shape[0]:
        raise FathomError(
            f"logits of shape {logits.shape} do not match {masks.shape[0]} masks and "
            f"{labels.shape[0]} labels; expected [masks, examples, classes]"
        )
    if labels.shape[0] == 0:
        raise FathomError("the split is empty; an audit needs at least one example")
    z = logits.astype(np.float64)
    idx = np.arange(labels.shape[0])
    true = z[:, idx, labels]
    others = z.copy()
    others[:, idx, labels] = -np.inf
    margin = true - others.max(axis=2)
    zmax = z.max(axis=2, keepdims=True)
    logsumexp = np.log(np.exp(z - zmax).sum(axis=2)) + zmax[..., 0]
    ce = logsumexp - true
    correct = z.argmax(axis=2) == labels[None, :]
    return MaskScores(
        masks=masks.astype(np.uint8),
        labels=labels.astype(np.int64),
        logits=logits.astype(np.float32),
        correct=correct,
        margin=margin,
        ce=ce,
    )


@torch.no_grad()
def mask_logits(
    model: nn.Module,
    x: torch.Tensor,
    masks: np.ndarray,
    batch_size: int = 2000,
    on_mask: Callable[[], None] | None = None,
) -> np.ndarray:
    """Logits ``[M, N, C]`` (float32, on the host) of ``model`` under each mask.

    Evaluation mode (dropout off, BatchNorm on its running statistics), gain one for kept
    branches, removed branches not computed (:func:`fathom.depth.branch_mask`). The model
    must return logits ``[batch, classes]`` of a floating dtype. ``on_mask`` is called after
    each mask (progress).
    """
    out = []
    with dense_eval(model), state_kept(model, parameters=True):
        for row in masks:
            with branch_mask(model, tuple(int(b) for b in row)):
                chunks = [
                    _checked_logits(model(x[s : s + batch_size]), min(batch_size, x.shape[0] - s))
                    for s in range(0, x.shape[0], batch_size)
                ]
            # note: this is a CPU-GPU sync point (once per mask per split)
            out.append(torch.cat(chunks).float().cpu().numpy())
            if on_mask is not None:
                on_mask()
    return np.stack(out)


def _checked_logits(logits: object, batch: int) -> torch.Tensor:
    if (
        not isinstance(logits, torch.Tensor)
        or logits.dim() != 2
        or logits.shape[0] != batch
        or not logits.is_floating_point()
    ):
        what = (
            f"{logits.dtype} tensor of shape {list(logits.shape)}"
            if isinstance(logits, torch.Tensor)
            else type(logits).__name__
        )
        raise FathomError(
            f"the model returned a {what} for a batch of {batch}; the audit needs floating "
            "logits [batch, classes] (wrap a model that returns a tuple or dict so that its "
            "forward returns the logits)"
        )
    return logits


def _check_split(x: torch.Tensor, y: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise FathomError("evaluate_masks needs tensors x (inputs) and y (integer labels)")
    if y.dim() != 1 or y.is_floating_point() or y.dtype == torch.bool:
        raise FathomError(
            f"labels y must be a 1-D integer tensor of class indices, got {y.dtype} of shape "
            f"{list(y.shape)}"
        )
    if x.dim() == 0 or x.shape[0] != y.shape[0]:
        raise FathomError(
            f"x holds {x.shape[0] if x.dim() else 0} examples but y holds {y.shape[0]} labels; "
            "pass one label per example"
        )


def evaluate_masks(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    masks: np.ndarray | None = None,
    batch_size: int = 2000,
    on_mask: Callable[[], None] | None = None,
    *,
    loss: str | Loss | LabelLoss | None = None,
    target: str | None = None,
) -> MaskScores:
    """Every branch mask of any model with :class:`fathom.depth.SkippableResidual` branches.

    ``masks`` defaults to all ``2^k`` (:func:`fathom.audit.masks.enumerate_masks` order,
    row ``m`` keeps branch ``l`` iff bit ``l`` of ``m``). Returns per-example logits, CE
    and correctness per mask (module formulas; ``.accuracy()``, ``.mean_ce()``,
    ``.damage()``); every module's mode, the gains, masks, buffers and parameters are
    restored (a forward that updates one in place is undone: :func:`fathom.depth.state_kept`).

    ``loss``: the loss the damage is measured in (default plain cross-entropy): a name of
    :data:`fathom.losses.LOSSES`, a :class:`fathom.losses.Loss`
    (``make_loss("cross_entropy", label_smoothing=0.1)``) or a
    :class:`fathom.losses.labels.LabelLoss`; ``target`` how the integer labels ``y`` meet it
    (``"labels"``, cross-entropy's; ``"one_hot"``, which ``"mse"`` and ``"bce_with_logits"``
    need stated).
    """
    from fathom.audit.costs import check_masks

    chosen = _label_loss(loss, target)
    _check_split(x, y)
    masks = check_masks(model, masks)
    logits = mask_logits(model, x, masks, batch_size, on_mask)
    labels = y.cpu().numpy()
    if labels.size and (labels.min() < 0 or labels.max() >= logits.shape[2]):
        raise FathomError(
            f"labels range over [{labels.min()}, {labels.max()}] but the model has "
            f"{logits.shape[2]} classes"
        )
    return scores_from_logits(logits, labels, masks).with_loss(chosen)


def _label_loss(loss: object, target: str | None) -> LabelLoss | None:
    """The :class:`~fathom.losses.labels.LabelLoss` of ``evaluate_masks``' arguments."""
    from fathom.losses.kinds import CrossEntropy, make_loss
    from fathom.losses.labels import LabelLoss

    if isinstance(loss, LabelLoss):
        if target is not None and target != loss.target:
            raise FathomError(
                f"target={target!r} beside a LabelLoss whose target is {loss.target!r}: pass one"
            )
        return loss
    if loss is None and target is None:
        return None
    made = make_loss("cross_entropy" if loss is None else loss)
    default = "labels" if isinstance(made, CrossEntropy) else None
    return LabelLoss(made, target or default)  # type: ignore[arg-type]


def save_scores(path: str, splits: dict[str, MaskScores], meta: dict[str, str]) -> None:
    """Atomic ``np.savez_compressed``: ``<split>/{masks,labels,logits,correct,margin}`` plus ``meta/<key>``.

    Later analyses reload with :func:`load_scores` and need no model.
    """
    arrays: dict[str, np.ndarray] = {}
    for name, s in splits.items():
        arrays[f"{name}/masks"] = s.masks
        arrays[f"{name}/labels"] = s.labels
        arrays[f"{name}/logits"] = s.logits
        arrays[f"{name}/correct"] = s.correct
        arrays[f"{name}/margin"] = s.margin.astype(np.float32)
    losses = {s.loss for s in splits.values()}
    if len(losses) > 1:
        raise FathomError("the splits of one scores file were scored under different losses")
    loss = losses.pop() if losses else None
    if loss is not None:
        arrays["meta/loss"] = np.asarray(json.dumps(loss.record(), sort_keys=True))
    for key, value in meta.items():
        arrays[f"meta/{key}"] = np.asarray(str(value))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())


def load_scores(path: str) -> tuple[dict[str, MaskScores], dict[str, str]]:
    """Inverse of :func:`save_scores`; margins, CE and the loss's ``L_mi`` (``meta/loss``,
    when the scores were under another loss) are recomputed from the stored logits."""
    from fathom.losses.labels import LabelLoss

    with np.load(path, allow_pickle=False) as data:
        names = sorted({k.split("/")[0] for k in data.files if not k.startswith("meta/")})
        meta = {k.split("/", 1)[1]: str(data[k]) for k in data.files if k.startswith("meta/")}
        loss = LabelLoss.from_record(json.loads(meta.pop("loss"))) if "loss" in meta else None
        splits = {
            n: scores_from_logits(
                data[f"{n}/logits"], data[f"{n}/labels"], data[f"{n}/masks"]
            ).with_loss(loss)
            for n in names
        }
    return splits, meta
