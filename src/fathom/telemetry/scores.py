"""Per-class scores on a full split: counts, per-class accuracy, confusion matrix."""

from __future__ import annotations

import torch


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, classes: int) -> torch.Tensor:
    """``C[t, p]`` = number of examples of true class ``t`` predicted as ``p`` (int64, on ``pred``'s device)."""
    idx = target.reshape(-1).long() * classes + pred.reshape(-1).long()
    return torch.bincount(idx, minlength=classes * classes).reshape(classes, classes)


def class_scores(confusion: torch.Tensor) -> tuple[list[int], list[float | None]]:
    """From a confusion matrix: ``count_c = sum_p C[c, p]`` and ``acc_c = C[c, c] / count_c``.

    An empty class (``count_c = 0``) has accuracy ``None``.
    """
    counts = confusion.sum(dim=1).tolist()  # note: device-to-host reads
    diag = torch.diagonal(confusion).tolist()
    acc = [None if n == 0 else d / n for d, n in zip(diag, counts, strict=True)]
    return [int(n) for n in counts], acc
