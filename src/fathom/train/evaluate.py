"""Full-split scores in dense evaluation mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fathom.depth import dense_eval

if TYPE_CHECKING:
    from fathom.losses.labels import LabelLoss


@dataclass(frozen=True)
class SplitScores:
    """A split's accuracy and cross-entropy, and its ``[loss]`` when one was asked for
    (:func:`scores_of_split`); ``None`` for an empty split (and ``loss`` when not asked)."""

    acc: float | None
    ce: float | None
    loss: float | None = None


@torch.no_grad()
def scores_of_split(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 2000,
    predictions: list[torch.Tensor] | None = None,
    loss: LabelLoss | None = None,
) -> SplitScores:
    """Accuracy, mean cross-entropy and (``loss``) a run's ``[loss]`` over a whole split, in
    one dense pass (gain one, dropout off).

    ``acc = (1/N) sum_i [argmax_c z_ic == y_i]``;
    ``ce = (1/N) sum_i -log softmax(z_i)_{y_i}`` in nats, accumulated in float64;
    ``loss``: the split as one batch, ``(1/M) sum_ip m_ip l_ip`` for the mean (``M`` the valid
    terms of the whole split), ``sum_ip m_ip l_ip`` for the sum, float64
    (:meth:`fathom.losses.labels.LabelLoss.split_sums`).
    An empty split gives ``None``s. When ``predictions`` is a list, the predicted
    classes (argmax) of every example are appended to it, for instruments to reuse.
    """
    n = int(y.shape[0])
    if n == 0:
        return SplitScores(None, None)
    correct = torch.zeros((), dtype=torch.int64, device=y.device)
    ce_sum = torch.zeros((), dtype=torch.float64, device=y.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=y.device)
    count = 0
    with dense_eval(model):
        for start in range(0, n, batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            logits = model(xb)
            pred = logits.argmax(dim=1)
            correct += (pred == yb).sum()
            if predictions is not None:
                predictions.append(pred)
            ce_sum += F.cross_entropy(logits.double(), yb, reduction="sum")
            if loss is not None:
                total, m = loss.split_sums(logits, yb)
                loss_sum += total
                count += m
    # note: this is a CPU-GPU sync point (once per split per evaluated epoch)
    value = None if loss is None else loss.reduce(loss_sum.item(), count)
    return SplitScores(correct.item() / n, ce_sum.item() / n, value)


def split_scores(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 2000,
    predictions: list[torch.Tensor] | None = None,
) -> tuple[float | None, float | None]:
    """``(acc, ce)`` of :func:`scores_of_split` (an empty split gives ``(None, None)``)."""
    s = scores_of_split(model, x, y, batch_size, predictions)
    return s.acc, s.ce


@torch.no_grad()
def token_scores(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 64
) -> tuple[float | None, float | None]:
    """Token accuracy and mean token cross-entropy of a next-token model over a whole split of
    windows (``x`` ``[W, T]``, ``y`` ``[W, T]``), dense (gain one, dropout off).

    ``acc = (1/M) #{(w, t) : argmax_v z_wtv == y_wt}``;
    ``ce = (1/M) sum_(w,t) -log softmax(z_wt)_{y_wt}`` in nats per token, accumulated in
    float64 (:func:`fathom.models.gpt.token_cross_entropy` summed), over the ``M`` scored
    positions (targets other than ``-1``). An empty split gives ``(None, None)``.
    """
    from fathom.models.gpt import IGNORE_INDEX, token_cross_entropy

    scored = int((y != IGNORE_INDEX).sum())
    if scored == 0:
        return None, None
    correct = torch.zeros((), dtype=torch.int64, device=y.device)
    ce_sum = torch.zeros((), dtype=torch.float64, device=y.device)
    with dense_eval(model):
        for start in range(0, int(y.shape[0]), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            logits = model(xb)
            correct += (logits.argmax(dim=-1) == yb).sum()
            ce_sum += token_cross_entropy(logits.double(), yb, reduction="sum")
    # note: this is a CPU-GPU sync point (once per split per evaluated epoch)
    return correct.item() / scored, ce_sum.item() / scored
