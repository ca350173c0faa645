"""The export targets: one table, name -> backend module and capabilities.

A backend is one module whose functions implement :class:`fathom.export.backend.ExportBackend`
(post-hoc export and its read-back) and, where ``live`` is set,
:class:`fathom.export.backend.LiveBackend` (streaming a run's rows while it trains); adding
one is that module plus one entry here. Everything that names targets derives from this table:
``fathom export --to`` choices, ``--live`` and the ``[live]`` config's ``backends``, and the
docs (checked by the tests). The table holds names and module paths only, so validating a
config or building the CLI imports no backend, no export code and no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExportTarget:
    """``module``: the backend module (imported on first use); ``live``: it also streams
    rows during training; ``numbers_only``: fields that are not numbers are left out (and the
    read-back notes them); ``analyses``: it exports the runs' curvature and audit results
    (:mod:`fathom.export.analyses`; their files' hashes join the export's fingerprint);
    ``options``: the export options its ``write`` takes as keywords (``fathom export
    --checkpoints``), refused for a target without them."""

    module: str
    live: bool = False
    numbers_only: bool = True
    analyses: bool = False
    options: tuple[str, ...] = ()


EXPORT_TARGETS: dict[str, ExportTarget] = {
    "jsonl": ExportTarget("fathom.export.jsonl", numbers_only=False),
    "wandb": ExportTarget(
        "fathom.export.wandb_export", live=True, analyses=True, options=("checkpoints",)
    ),
    "tensorboard": ExportTarget("fathom.export.tensorboard_export", live=True, analyses=True),
}


def export_targets() -> tuple[str, ...]:
    """Every target of :data:`EXPORT_TARGETS`, in table order."""
    return tuple(EXPORT_TARGETS)


EXPORT_OPTIONS: dict[str, str] = {
    "checkpoints": "each run's saved checkpoints as artifacts, verified against the manifest's hashes",
}
"""Every export option (a keyword of a backend's ``write``) and what it adds."""


def live_targets() -> tuple[str, ...]:
    """The targets that stream live, in table order."""
    return tuple(name for name, t in EXPORT_TARGETS.items() if t.live)
