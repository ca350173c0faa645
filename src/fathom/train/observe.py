"""What the loop records at an epoch boundary: scores, selection, telemetry, health.

Every instrument runs on the boundary's state and leaves it untouched (parameters,
optimizer state, gates, train/eval flags, the training RNG). Scores are dense full-split
accuracy and CE (:func:`fathom.train.evaluate.scores_of_split`; per token, with the perplexity
``{split}/ppl``, for a next-token model: :func:`~fathom.train.evaluate.token_scores`), and for
a run with a ``[loss]`` table its loss over each split, ``{split}/loss``, in the same pass;
the selected checkpoint is the epoch >= 1 of minimum finite validation objective
(:func:`fathom.config.run.objective_field`: the CE of the logits for the default loss, the
``[loss]`` table's ``val/loss`` otherwise).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch

from fathom.base.interrupts import uninterrupted
from fathom.config.models import SPLITS, schedule_due
from fathom.config.run import objective_field
from fathom.train.evaluate import scores_of_split, token_scores

if TYPE_CHECKING:
    from fathom.train.session import Session


def eval_due(cfg, epoch: int) -> bool:
    """Evaluate at epoch 0, at ``eval.first``, every ``eval.every`` epochs, and at the last.

    With a stopping target (``stop.target_test_acc``) every epoch is evaluated.
    """
    e = cfg.eval
    if cfg.stop.target_test_acc is not None:
        return True
    return schedule_due(epoch, (0, *e.first), e.every, cfg.optim.epochs)


def health_due(cfg, epoch: int) -> bool:
    """The health instrument: epoch 0, every ``health.every`` epochs, and the last."""
    h = cfg.health
    return h.enabled and schedule_due(epoch, (0,), h.every, cfg.optim.epochs)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: CPU-GPU sync point (epoch boundary only)


def _score_splits(s: Session, row: dict[str, Any], keep_predictions: bool) -> dict:
    """Fill ``{split}/acc`` and ``{split}/ce`` (and ``{split}/loss`` for a run with a
    ``[loss]`` table); return the predictions kept for telemetry."""
    predictions: dict[str, torch.Tensor] = {}
    loss = s.loss
    t0 = time.perf_counter()
    for name in SPLITS:
        if name not in s.cfg.eval.splits:
            row[f"{name}/acc"], row[f"{name}/ce"] = None, None
            if loss is not None:
                row[f"{name}/loss"] = None
            if s.tokens:
                row[f"{name}/ppl"] = None
            continue
        x, y = getattr(s.splits, f"{name}_x"), getattr(s.splits, f"{name}_y")
        if s.tokens:  # a next-token model: per-token scores and perplexity
            acc, ce = token_scores(s.model, x, y, s.cfg.eval.batch_size)
            row[f"{name}/acc"], row[f"{name}/ce"] = acc, ce
            row[f"{name}/ppl"] = None if ce is None else math.exp(ce)
            continue
        preds: list[torch.Tensor] | None = [] if keep_predictions else None
        scores = scores_of_split(s.model, x, y, s.cfg.eval.batch_size, preds, loss)
        row[f"{name}/acc"], row[f"{name}/ce"] = scores.acc, scores.ce
        if loss is not None:  # a [loss] table: its value over the split beside the CE
            row[f"{name}/loss"] = scores.loss
        if preds:
            predictions[name] = torch.cat(preds)
    sync(s.device)
    s.progress.clocks.evaluation_s += time.perf_counter() - t0
    return predictions


def select(s: Session, epoch: int, row: dict[str, Any]) -> None:
    """Keep the weights of minimum finite validation objective (epochs >= 1) as ``selected``:
    the row's :func:`~fathom.config.run.objective_field` (``val/ce``, or ``val/loss`` for a
    ``[loss]`` table). The selection records ``epoch`` and ``val_ce`` (the CE of the logits
    there), and for a ``[loss]`` table ``val_loss``, the value it was selected by."""
    best = s.progress.best
    field = objective_field(s.cfg)
    key = field.replace("/", "_")
    value = row.get(field)
    if epoch < 1 or value is None or not math.isfinite(value):
        return
    if best.get(key) is not None and value >= best[key]:
        return
    with uninterrupted():  # the file, its entry and the selection it records
        s.progress.selected_ckpt = s.save_weights("selected", epoch)
        best.update({"epoch": epoch, "val_ce": row.get("val/ce"), key: value})


def _timed_instrument(s: Session, fn, *args) -> dict[str, Any]:
    """Run an instrument on the telemetry clock (the first run also sets the cold time)."""
    clocks = s.progress.clocks
    t0 = time.perf_counter()
    out = fn(*args)
    sync(s.device)
    dt = time.perf_counter() - t0
    if clocks.telemetry_cold_s is None:
        clocks.telemetry_cold_s = dt
    clocks.telemetry_s += dt
    return out


def _instruments_due(s: Session, epoch: int) -> bool:
    """Whether an instrument on the telemetry clock (telemetry, health) runs at ``epoch``."""
    return (s.recorder is not None and s.recorder.due(epoch)) or health_due(s.cfg, epoch)


def boundary_schedule(s: Session, first: int) -> dict[str, Any]:
    """What the epochs ``first..epochs`` will observe, for a progress display's ETA: the
    ``"schedule"`` event ``{"epoch", "epochs", "first", "evaluations", "instruments", <clocks>}``
    (``epoch``: the boundary training starts from, ``first - 1``, as every event carries
    one; the epochs that evaluate, and those that run an instrument on the telemetry clock;
    the cumulative clocks so far)."""
    epochs = s.cfg.optim.epochs
    span = range(first, epochs + 1)
    clocks = s.progress.clocks
    return {
        "epoch": first - 1,
        "epochs": epochs,
        "clock/training_s": clocks.training_s,
        "clock/evaluation_s": clocks.evaluation_s,
        "clock/telemetry_s": clocks.telemetry_s,
        "first": first,
        "evaluations": [e for e in span if eval_due(s.cfg, e)],
        "instruments": [e for e in span if _instruments_due(s, e)],
    }


def observe(s: Session, epoch: int, fields: dict[str, Any]) -> dict[str, Any] | None:
    """The history row of this boundary (written), or ``None`` when nothing is due.

    ``fields``: the epoch's training fields (``train/loss_running``, ``optim/lr``, the
    stepper's own), recorded in the row as given.
    """
    cfg = s.cfg
    evaluate = eval_due(cfg, epoch)
    tel_due = s.recorder is not None and s.recorder.due(epoch)
    health = health_due(cfg, epoch)
    if not (evaluate or tel_due or health):
        return None
    if s.on_progress is not None and epoch > 0:  # a display says what runs now
        s.on_progress(
            "boundary",
            {
                "epoch": epoch,
                "epochs": cfg.optim.epochs,
                "evaluate": [n for n in SPLITS if n in cfg.eval.splits] if evaluate else [],
                "instruments": tel_due or health,
            },
        )
    row: dict[str, Any] = {"epoch": epoch, "step": s.progress.step, **fields}
    predictions: dict[str, torch.Tensor] = {}
    if evaluate:
        predictions = _score_splits(s, row, keep_predictions=tel_due)
        select(s, epoch, row)
    if tel_due:
        # the instrument reuses this boundary's dense predictions (no second forward pass)
        ctx = s.context(epoch, fields.get("optim/lr"))
        row.update(_timed_instrument(s, s.recorder.observe, ctx, predictions or None))
    if health:
        row.update(_timed_instrument(s, s.health_row, epoch))
    elif cfg.health.enabled:
        from fathom.dynamics.probe import HEALTH_KEYS

        row.update(dict.fromkeys(HEALTH_KEYS))  # not due at this boundary: null, never absent
    clocks = s.progress.clocks
    row.update(
        {
            "clock/training_s": clocks.training_s,
            "clock/training_cpu_s": clocks.training_cpu_s,
            "clock/evaluation_s": clocks.evaluation_s,
            "clock/telemetry_s": clocks.telemetry_s,
            "clock/elapsed_s": s.elapsed(),
            "clock/unix_s": time.time(),  # the row's own timestamp (exports' wall time)
        }
    )
    s.writer.row(row)
    if s.on_progress is not None:
        s.on_progress("epoch", row)
    return row
