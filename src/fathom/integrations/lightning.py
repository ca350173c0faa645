"""A PyTorch Lightning callback: Fathom's instruments at every epoch end, logged through
Fathom's export targets (:class:`fathom.integrations.observer.EpochObserver`)::

    from fathom.integrations.lightning import FathomCallback

    cb = FathomCallback("logs/fathom", probe=(x_probe, y_probe), targets=("tensorboard", "wandb"))
    lightning.Trainer(max_epochs=10, callbacks=[cb]).fit(module, loader)
    cb.reports  # each log read back: [VerifyReport, ...]

When it observes: ``on_train_start`` (epoch 0: the parameters before any step, which are
also the reference of the displacement fields) and ``on_train_epoch_end`` (epoch ``e`` after
``e`` epochs: Lightning runs the epoch's validation before this hook, so the row holds the
epoch's ``callback_metrics``, validation included, one-number entries only). The optimizer
is the trainer's first. The module's ``hparams`` and the learning rate are the run's config
(HParams in TensorBoard, the config in W&B). ``on_train_end`` closes and verifies the logs
(``status`` ``complete``); ``on_exception`` closes them as ``failed``.

The module must return logits from ``forward(x)`` (the instruments call ``module(x_probe)``).
Works with the ``lightning`` package (``lightning.pytorch``) or, without it, the older
``pytorch_lightning``; install the extra with ``pip install -e '.[lightning]'``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fathom.config.live import LiveConfig
from fathom.errors import FathomError, install_hint
from fathom.export.common import VerifyReport
from fathom.integrations.observer import EpochObserver

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def _lightning() -> Any:
    for name in _PACKAGES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise FathomError(
        "the Lightning callback needs PyTorch Lightning, which is not installed; install the "
        f"extra with `{install_hint('lightning')}`"
    )


def _run_config(trainer: Any, module: Any) -> dict[str, Any]:
    """The module's ``hparams``, its class, the first optimizer's learning rate and the epochs."""
    hparams = dict(getattr(module, "hparams", {}) or {})
    optimizers = list(getattr(trainer, "optimizers", []) or [])
    lr = optimizers[0].param_groups[0].get("lr") if optimizers else None
    config: dict[str, Any] = {
        "framework": "lightning",
        "model": {"class": type(module).__name__},
        "optim": {"lr": lr, "name": type(optimizers[0]).__name__ if optimizers else None},
        "max_epochs": getattr(trainer, "max_epochs", None),
    }
    if hparams:
        config["hparams"] = hparams
    return config


class FathomCallback(_lightning().Callback):  # type: ignore[misc]
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
        super().__init__()
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

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.observer.rows

    @staticmethod
    def _optimizer(trainer: Any) -> Any:
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        return optimizers[0] if optimizers else None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.is_global_zero:
            return
        self.observer.start(pl_module, _run_config(trainer, pl_module))
        self.observer.observe(0, self._optimizer(trainer), {})

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.is_global_zero:
            return
        epoch = trainer.current_epoch + 1
        self.observer.observe(epoch, self._optimizer(trainer), dict(trainer.callback_metrics))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero and self.observer.sinks:
            self.reports = self.observer.close("complete")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if trainer.is_global_zero and self.observer.sinks:
            self.reports = self.observer.close("failed")
