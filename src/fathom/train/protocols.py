"""The two interfaces the loop talks to: a stepper and a recorder (what it calls, nothing more).

Both are ``runtime_checkable`` :class:`typing.Protocol`\\ s, so ``isinstance`` checks that an
object has the members (not their signatures); ``tests/test_train_protocols.py`` checks the
concrete classes against them. A new execution path is a class satisfying :class:`Stepper`
plus its branch in :func:`fathom.train.steppers.make_stepper`; a new epoch-boundary recorder
is a class satisfying :class:`Recorder`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from fathom.telemetry.context import EpochContext
from fathom.train.plan import EpochPlan
from fathom.train.step import Tick


@runtime_checkable
class Stepper(Protocol):
    """Runs an epoch's optimizer steps from its plan; owns nothing else of the run.

    ``name`` is the manifest's ``execution.path``; ``captured`` the CUDA graphs captured so
    far (``execution.graphs_captured``); ``tick`` (set by the loop, may be ``None``) is called
    before each step with Python ints only.
    """

    name: str
    captured: int
    tick: Tick | None

    def run_epoch(self, plan: EpochPlan) -> torch.Tensor:
        """Every step of ``plan``; return the device sum (float64) of the batches' mean losses."""
        ...

    def epoch_fields(self) -> dict[str, Any]:
        """The stepper's own history fields of the epoch just run (read at the boundary)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The stepper's own state a resume continues (its generators)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Recorder(Protocol):
    """Epoch-boundary telemetry as the loop uses it (:class:`fathom.telemetry.Recorder`).

    ``schema_changes``: one record per change of the field set (the manifest's
    ``telemetry.schema_changes``).
    """

    schema_changes: list[dict[str, Any]]

    def due(self, epoch: int) -> bool:
        """Whether ``observe`` runs at this boundary."""
        ...

    def observe(
        self, ctx: EpochContext, predictions: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, Any]:
        """The history fields at this boundary; leaves every piece of state as found."""
        ...

    def layer_records(self) -> list[dict[str, Any]] | None:
        """The instrumented layers for the manifest (``None`` before the first observation)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
