"""What the trainer changes in a run's manifest, as methods of :class:`RunWriter`.

The trainer never indexes or mutates the manifest itself (``tests/test_rundir_record.py``
checks ``fathom.train`` for it): it prepares a :class:`~fathom.rundir.record.RunManifest`
and then calls these methods, each validated by its section's type
(:mod:`fathom.rundir.sections`). :meth:`RunWriter.commit` writes what they recorded.
"""

from __future__ import annotations

from typing import Any

from fathom.errors import FathomError
from fathom.rundir.record import RunManifest
from fathom.rundir.sections import Stop, Telemetry


class ManifestUpdates:
    """The manifest-changing half of :class:`fathom.rundir.writer.RunWriter`."""

    manifest: RunManifest | None
    commit: Any  # RunWriter.commit / close
    close: Any

    def prepare(self, manifest: RunManifest) -> None:
        """Hold ``manifest`` for this run: the sections change through the methods below and
        are written by :meth:`start` / :meth:`begin_resumed`, never before."""
        if not isinstance(manifest, RunManifest):
            raise FathomError(
                f"RunWriter.prepare() takes a RunManifest, got a {type(manifest).__name__}; "
                "build it with fathom.rundir.RunManifest(...)"
            )
        self.manifest = manifest

    # -- the manifest's sections ----------------------------------------------------------
    def progress(
        self,
        *,
        epochs_completed: int,
        steps_completed: int,
        clocks: dict[str, float | None],
        telemetry: Telemetry,
        training_order: str,
        masks: str,
        selected: dict[str, Any],
        checkpoints: dict[str, dict[str, Any]],
        selected_checkpoint: dict[str, Any] | None,
        graphs_captured: int | None,
    ) -> None:
        """Record the run's progress at an epoch boundary (committed by :meth:`commit`):
        completed epochs and steps, clocks, telemetry overhead and layers, the training-order
        and mask digest chains, the selected epoch, the weights entries, graphs captured."""
        m = self._held()
        m.epochs_completed, m.steps_completed = epochs_completed, steps_completed
        m.clocks = clocks  # type: ignore[assignment]  # validated into Clocks
        m.telemetry = telemetry
        m.hashes = _updated(m.hashes, training_order=training_order, masks=masks)
        m.selected = selected  # type: ignore[assignment]
        m.checkpoints = checkpoints  # type: ignore[assignment]
        m.selected_checkpoint = selected_checkpoint  # type: ignore[assignment]
        m.execution = _updated(m.execution, graphs_captured=graphs_captured)

    def set_stop(
        self, *, target_test_acc: float, epoch: int, training_s: float, elapsed_s: float
    ) -> None:
        """A reached target stops the run at ``epoch`` (the ``stop`` section)."""
        self._held().stop = Stop(
            target_test_acc=target_test_acc,
            epoch=epoch,
            training_s=training_s,
            elapsed_s=elapsed_s,
        )

    def set_final(
        self, *, final_params: str | None, epoch: int | None, diverged_epoch: int | None
    ) -> None:
        """The outcome's digests: ``hashes.final_params`` and ``final.epoch`` (``None`` unless
        the run completed) and ``diverged_epoch`` (``None`` unless it diverged)."""
        m = self._held()
        m.hashes = _updated(m.hashes, final_params=final_params)
        m.final = {"epoch": epoch}  # type: ignore[assignment]
        m.diverged_epoch = diverged_epoch

    def finish(
        self, status: str, reason: str | None = None, *, failure: dict[str, Any] | None = None
    ) -> None:
        """Set the final status, its reason (and a failure's cause), commit, release the lock."""
        m = self._held()
        m.status, m.status_reason = status, reason  # type: ignore[assignment]
        if failure is not None:
            m.failure = failure  # type: ignore[assignment]
        try:
            self.commit()
        finally:
            self.close()

    def _held(self) -> RunManifest:
        if self.manifest is None:
            raise FathomError("the writer holds no manifest: call prepare(manifest) first")
        return self.manifest

    def _json(self) -> dict[str, Any]:
        return self._held().to_json()


def _updated(section: Any, **changes: Any) -> Any:
    """``section`` with ``changes``, validated by its type."""
    return type(section).model_validate({**section.model_dump(by_alias=True), **changes})
