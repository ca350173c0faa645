"""The epoch-boundary recorder: the trainer's thin object over :class:`Instruments`.

``Recorder.observe(ctx)`` returns flat history fields (names declared in
:mod:`fathom.telemetry.registry`): the probe and parameter families from
:class:`fathom.telemetry.instruments.Instruments` (layers found by :mod:`fathom.seam` on any
model, keyed by qualified module name) and the whole-split ``scores``. It is read-only by
construction (see :mod:`fathom.telemetry.instruments`); scores run under ``no_grad`` in dense
evaluation mode.

**The field set follows the model.** When the model's structure changes between
observations (a frozen layer unfrozen, a head swapped, through the library API), the
instruments rediscover its layers and the next row carries the fields of the new layers
(a removed layer's fields are absent from then on); each change is recorded in
:attr:`Recorder.schema_changes` (epoch, the new layers, the fields added and removed), kept
across a resume (``state_dict``). A history row therefore always holds the fields of the
structure it measured, never a stale set.

**Sequence models** (a language model's ``[N, T, V]`` next-token logits): the instruments
read the run's own loss (``loss``: token-level cross-entropy over the valid positions,
``class_dim=-1``; one probe "example" is one sequence window, so per-example moments are
per window). Two families are defined on ``[N, C]`` logits with one label per example and
do not apply (:data:`_SEQUENCE_NOT_APPLICABLE`): naming one in ``telemetry.families`` is
refused with the reason, and the aliases (``all``, ``cheap``) expand to the families that
apply, the others listed with their reasons in :attr:`Recorder.left_out` (the run's
manifest records them under ``telemetry.families_left_out``).

The caller times ``observe`` with the telemetry clock (the trainer records
``clock/telemetry_s`` and the cold first call, which includes layer discovery).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fathom.config import TelemetryConfig
from fathom.config.models import SPLITS, schedule_due
from fathom.errors import FathomError
from fathom.losses.kinds import Loss
from fathom.telemetry.instruments import Instruments, read_only
from fathom.telemetry.registry import ALIASES, expected_names, resolve_families
from fathom.telemetry.scores import class_scores, confusion_matrix

if TYPE_CHECKING:
    from fathom.data import DataSplits
    from fathom.telemetry.context import EpochContext


Value = float | int | None | list
_SEQUENCE_NOT_APPLICABLE: dict[str, str] = {
    "probe": "probe/ce and probe/acc are defined on [N, C] logits with one label per example; "
    "a language model's per-token cross-entropy and perplexity are the history's "
    "{split}/ce and {split}/ppl",
    "scores": "per-class counts and confusion matrices read one predicted class per example; "
    "a language model predicts one token per position",
}
"""The families that do not apply to a sequence model's ``[N, T, V]`` logits, with why."""


def _sequence_families(names: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
    """``(families, left_out)`` of ``telemetry.families`` for a sequence model: a family named
    explicitly that does not apply is refused with its reason; an alias's such families are
    left out, each with its reason."""
    named = [n for n in names if n in _SEQUENCE_NOT_APPLICABLE]
    if named:
        raise FathomError(
            f"telemetry family {named[0]!r} does not apply to a language model's [N, T, V] "
            f"logits: {_SEQUENCE_NOT_APPLICABLE[named[0]]}; remove it from telemetry.families"
        )
    chosen = resolve_families(names)
    left = {
        f: why
        for f, why in _SEQUENCE_NOT_APPLICABLE.items()
        if f in chosen and any(f in ALIASES.get(n, ()) for n in names)
    }
    return tuple(f for f in chosen if f not in left), left


def _split_xy(splits: DataSplits, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return getattr(splits, f"{name}_x"), getattr(splits, f"{name}_y")


class Recorder:
    """Epoch-boundary telemetry of any model returning ``[N, classes]`` logits, or (given
    ``loss`` with ``sequence=True``) a sequence model's ``[N, T, V]`` logits (module docstring)."""

    def __init__(
        self,
        config: TelemetryConfig,
        *,
        epochs: int,
        splits: DataSplits,
        model: nn.Module,
        seed: int,
        loss: str | Loss = "cross_entropy",
        sequence: bool = False,
    ) -> None:
        self.config = config
        self.epochs = int(epochs)
        self.seed = int(seed)
        self.left_out: dict[str, str] = {}
        if sequence:
            self.families, self.left_out = _sequence_families(tuple(config.families))
        else:
            self.families = resolve_families(config.families)
        bad = [e for e in config.first if e < 0 or e > self.epochs]
        if bad:
            raise FathomError(
                f"telemetry.first names epochs {bad} outside training (0 .. {self.epochs}); "
                f"remove them or raise optim.epochs"
            )
        fit_x, fit_y = _split_xy(splits, "fit")
        n_fit = int(fit_y.shape[0])
        if config.probe_size > n_fit:
            raise FathomError(
                f"telemetry.probe_size = {config.probe_size} is larger than the fitting split "
                f"({n_fit} examples); reduce telemetry.probe_size to at most {n_fit}"
            )
        self.probe_x = fit_x[: config.probe_size]
        self.probe_y = fit_y[: config.probe_size]
        self.splits = splits
        probe_families = tuple(f for f in self.families if f != "scores")
        # the trainer hands its own initial parameters to every observation (no copy here)
        self.instruments = Instruments(
            model, self.probe_x, self.probe_y, probe_families, initial_params={}, loss=loss
        )
        self.split_names = tuple(s for s in SPLITS if int(_split_xy(splits, s)[1].shape[0]) > 0)
        self._names: tuple[str, ...] | None = None
        self._names_seam: object = None
        # one record per change of the field set between observations (a structure change
        # mid-run): {"epoch", "layers" (the new layer names), "added", "removed"}
        self.schema_changes: list[dict[str, Any]] = []

    # -- schedule -------------------------------------------------------------------------
    def due(self, epoch: int) -> bool:
        return schedule_due(epoch, self.config.first, self.config.every, self.epochs)

    @property
    def classes(self) -> int:
        self.instruments.seam  # noqa: B018 - discovery sets the class count
        return self.instruments.classes

    def field_names(self) -> list[str]:
        """The names ``observe`` returns now, in registry order: expanded again whenever the
        instruments rediscovered the layers (a layer unfrozen, a head swapped: the
        structure key of :class:`Instruments` changed), never a stale set."""
        return list(self._current(None))

    def _current(self, epoch: int | None, checked: bool = False) -> tuple[str, ...]:
        """``checked``: the instruments have just checked their seam (an observation)."""
        ins = self.instruments
        seam = ins._seam if checked else ins.seam  # rediscovers when the structure changed
        if self._names is None or seam is not self._names_seam:
            layers = [layer.name for layer in seam.layers]
            names = tuple(
                expected_names(
                    self.families, layers, self.split_names, ins.classes, ins.inputs, ins.blocks
                )
            )
            if self._names is not None and names != self._names:
                self.schema_changes.append(
                    {
                        "epoch": epoch,
                        "layers": layers,
                        "added": [n for n in names if n not in self._names],
                        "removed": [n for n in self._names if n not in names],
                    }
                )
            self._names, self._names_seam = names, seam
        return self._names

    def state_dict(self) -> dict[str, Any]:
        """What a resume continues: the schema changes recorded so far."""
        return {"schema_changes": [dict(c) for c in self.schema_changes]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.schema_changes = [dict(c) for c in state.get("schema_changes", [])]

    def layer_records(self) -> list[dict[str, Any]] | None:
        """The instrumented layers (name, type, kind, shapes); ``None`` before discovery."""
        return None if self.instruments._seam is None else self.instruments.layer_records()

    # -- measurement ----------------------------------------------------------------------
    def observe(
        self, ctx: EpochContext, predictions: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, Value]:
        """All selected families at this epoch boundary; leaves every piece of state as found.

        ``predictions`` (optional): per split, the predicted class of every example (argmax
        of dense-evaluation logits) from the caller's own evaluation at this same boundary.
        Splits given there are scored from them instead of a second full-split forward pass.
        """
        row: dict[str, Value] = {}
        if self.instruments.families:  # checks the seam (rediscovers on a structure change)
            row.update(
                self.instruments.observe(
                    optimizer=ctx.optimizer, initial_params=ctx.initial_params, lr=ctx.lr
                )
            )
        names = self._current(ctx.epoch, checked=bool(self.instruments.families))
        if "scores" in self.families:
            with read_only(ctx.model), torch.no_grad():
                row.update(self._scores(ctx.model, ctx.config.eval.batch_size, predictions or {}))
        return {name: row[name] for name in names}

    def _scores(
        self, model: nn.Module, batch_size: int, predictions: Mapping[str, torch.Tensor]
    ) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for split in self.split_names:
            x, y = _split_xy(self.splits, split)
            given = predictions.get(split)
            if given is not None:
                if given.shape != y.shape:
                    raise FathomError(
                        f"predictions for split {split!r} have shape {tuple(given.shape)}, the split "
                        f"has {tuple(y.shape)} labels; pass one predicted class per example"
                    )
                conf = confusion_matrix(given.to(y.device), y, self.classes)
            else:
                conf = torch.zeros(self.classes, self.classes, dtype=torch.int64, device=y.device)
                for start in range(0, int(y.shape[0]), batch_size):
                    pred = model(x[start : start + batch_size]).argmax(dim=1)
                    conf += confusion_matrix(pred, y[start : start + batch_size], self.classes)
            counts, acc = class_scores(conf)
            for c in range(self.classes):
                row[f"split/{split}/class_count/{c}"] = counts[c]
                row[f"split/{split}/class_acc/{c}"] = acc[c]
            row[f"split/{split}/confusion"] = conf.tolist()
        return row
