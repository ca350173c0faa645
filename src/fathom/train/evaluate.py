"""Full-split scores in dense evaluation mode."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fathom.depth import dense_eval


@torch.no_grad()
def split_scores(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 2000,
    predictions: list[torch.Tensor] | None = None,
) -> tuple[float | None, float | None]:
    """Accuracy and mean cross-entropy over a whole split, dense (gain one, dropout off).

    ``acc = (1/N) sum_i [argmax_c z_ic == y_i]``;
    ``ce = (1/N) sum_i -log softmax(z_i)_{y_i}`` in nats, accumulated in float64.
    An empty split gives ``(None, None)``. When ``predictions`` is a list, the predicted
    classes (argmax) of every example are appended to it, for instruments to reuse.
    """
    n = int(y.shape[0])
    if n == 0:
        return None, None
    correct = torch.zeros((), dtype=torch.int64, device=y.device)
    ce_sum = torch.zeros((), dtype=torch.float64, device=y.device)
    with dense_eval(model):
        for start in range(0, n, batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            logits = model(xb)
            pred = logits.argmax(dim=1)
            correct += (pred == yb).sum()
            if predictions is not None:
                predictions.append(pred)
            ce_sum += F.cross_entropy(logits.double(), yb, reduction="sum")
    # note: this is a CPU-GPU sync point (once per split per evaluated epoch)
    return correct.item() / n, ce_sum.item() / n
