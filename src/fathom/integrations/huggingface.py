"""A Hugging Face ``transformers.Trainer`` callback: Fathom's instruments at every epoch end,
logged through Fathom's export targets (:class:`fathom.integrations.observer.EpochObserver`)::

    from fathom.integrations.huggingface import FathomCallback

    cb = FathomCallback("logs/fathom", probe=(x_probe, y_probe), targets=("tensorboard",))
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[cb]).train()
    cb.reports  # each log read back

When it observes: ``on_train_begin`` (epoch 0, the reference of displacement) and each
``on_epoch_end`` (epoch ``e`` after ``e`` epochs: the instruments measure the model then).
The Trainer logs the epoch's training loss and runs the epoch's evaluation *after*
``on_epoch_end``, so the row is written when the next epoch begins (or training ends),
with the numbers logged meanwhile (``on_log``: ``loss``,
``eval_loss``, ``learning_rate``, ...; the Trainer's fractional ``epoch`` and step counters
left out) join it. ``on_train_end`` writes the last row, closes and verifies the logs.

The instruments call the model on the probe inputs, ``model(x_probe)``, and read its logits:
the output itself when it is a tensor, else its ``logits`` (a ``ModelOutput`` or a dict).
The run's config (HParams, W&B config): the model class, the learning rate, epochs, batch
size, weight decay, seed and scheduler of the ``TrainingArguments``. Install the extra with
``pip install -e '.[huggingface]'``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from fathom.config.live import LiveConfig
from fathom.errors import FathomError, install_hint
from fathom.export.common import VerifyReport
from fathom.integrations.observer import EpochObserver, numbers

_ARGS = (
    "learning_rate",
    "num_train_epochs",
    "per_device_train_batch_size",
    "weight_decay",
    "seed",
    "lr_scheduler_type",
    "optim",
    "warmup_steps",
    "max_grad_norm",
)
"""The ``TrainingArguments`` that describe the training (the rest say where and how often)."""
_NOT_METRICS = ("epoch", "step", "total_flos", "train_runtime")
"""Trainer log entries that are counters or costs, not measurements of the model (and every
``*_per_second`` throughput)."""


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise FathomError(
            "the Hugging Face callback needs transformers, which is not installed; install the "
            f"extra with `{install_hint('huggingface')}`"
        ) from None


class Logits(nn.Module):
    """``model``'s logits as a plain tensor: the output, or its ``logits`` entry."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Any) -> Any:
        out = self.model(x)
        if isinstance(out, dict) or hasattr(out, "keys"):
            if "logits" not in out:
                raise FathomError(
                    f"{type(self.model).__name__} returned {type(out).__name__} without 'logits'; "
                    "the instruments need the model's logits for the probe"
                )
            return out["logits"]
        return out


def _run_config(args: Any, model: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"framework": "transformers", "model": {"class": type(model).__name__}}
    config["optim"] = {"lr": getattr(args, "learning_rate", None)}
    config["args"] = {k: str(v) if not isinstance(v, bool | int | float | str) else v
                      for k in _ARGS if (v := getattr(args, k, None)) is not None}  # fmt: skip
    return config


class FathomCallback(_transformers().TrainerCallback):  # type: ignore[misc]
    """Observe at epoch ends and log through Fathom's export targets (module docstring;
    the arguments are :class:`~fathom.integrations.observer.EpochObserver`'s)."""

    def __init__(
        self,
        out: str | Path,
        probe: tuple[Any, Any],
        *,
        targets: Sequence[str] = ("tensorboard",),
        families: str | Iterable[str] = "all",
        name: str = "run",
        project: str | None = None,
        group: str | None = None,
        live: LiveConfig | None = None,
    ) -> None:
        self.observer = EpochObserver(
            out,
            probe,
            targets=targets,
            families=families,
            name=name,
            project=project,
            group=group,
            live=live,
        )
        self.reports: list[VerifyReport] = []
        self.pending: tuple[dict[str, Any], dict[str, Any]] | None = None  # (measured, logged)
        self.epochs = 0

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.observer.rows

    def _flush(self) -> None:
        if self.pending is not None:
            measured, logged = self.pending
            self.pending = None
            self.observer.record(measured, logged)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kw):
        if not state.is_world_process_zero:
            return
        self.observer.start(Logits(model), _run_config(args, model))
        self.observer.observe(0, optimizer, {})

    def on_epoch_end(self, args, state, control, optimizer=None, **kw):
        if not state.is_world_process_zero:
            return
        self._flush()
        self.epochs += 1  # measured now: a best model loaded at the end is not this epoch's
        self.pending = (self.observer.measure(self.epochs, optimizer), {})

    def on_log(self, args, state, control, logs=None, **kw):
        if self.pending is not None and logs:
            kept = {
                k: v
                for k, v in logs.items()
                if k not in _NOT_METRICS and not k.endswith("_per_second")
            }
            self.pending[1].update(numbers(kept))

    def on_epoch_begin(self, args, state, control, **kw):
        if state.is_world_process_zero:
            self._flush()

    def on_train_end(self, args, state, control, **kw):
        if not state.is_world_process_zero or not self.observer.sinks:
            return
        self._flush()
        self.reports = self.observer.close("complete")
