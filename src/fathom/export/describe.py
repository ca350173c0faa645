"""A run described as it was trained: its hyperparameters, tags and job type, for the dashboards.

The config a run recorded says what was *asked*; a dashboard comparing runs needs what was
*trained*. Three rules, each one table:

* **Not hyperparameters** (:data:`NOT_HYPERPARAMETERS`): config entries that say where files
  are, how the run was observed or stored, or what it is called — never what was trained
  (``data.data_dir``, ``telemetry.*``, ``checkpoints.*``, ...). They stay in the W&B config
  (the full record) and are left out of TensorBoard's HParams. Unset options (``None``) are
  left out too: an absent hyperparameter reads as the default in TensorBoard's table.
* **As trained** (:func:`as_trained`): what the config became in the run, from the
  manifest and the model kind's row (:attr:`fathom.config.model_kinds.ModelKind.widths`): the
  hidden widths after ``width_mult`` (``max(1, round(w · width_mult))``,
  :func:`fathom.models.specs.scaled_widths`: ``[250, 200, 150, 100, 50]`` for ``× 0.1`` of the
  Ciresan MLP's full widths; a ``gpt``'s ``width`` at each block; none for a user's factory,
  or a table this version cannot read), the parameter count, the
  device and the execution path actually used (``device = "auto"`` and ``execution.path =
  "auto"`` name a choice, not what ran). In HParams these replace the config's entries.
* **Tags and job type** (:func:`run_tags`, :func:`job_type`): the model kind, recipe,
  dataset and status, the phase, and the config's own ``tags`` as ``key=value``; the job
  type is the phase (``tuning`` for a study's learning-rate grid, else ``train``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fathom.report.runs import RunData

NOT_HYPERPARAMETERS: dict[str, str] = {
    "data.data_dir": "where the dataset files are (the data's identity is data.dataset and its hashes)",
    "data.path": "where a user's arrays are (their identity is the recorded file hash)",
    "checkpoints": "which epochs were saved, not how they were trained",
    "telemetry": "what was observed (instruments are read-only: a run trains identically without)",
    "health": "what was observed",
    "live": "where the live logs went",
    "eval.batch_size": "memory per evaluation pass; the scores do not depend on it",
    "execution.max_graph_branches": "a CUDA-graph capture limit, not a training choice",
    "kind": "the config family ('run'), the same for every run",
    "name": "the run's name (the run id of every dashboard)",
    "study": "the study's name (W&B project, TensorBoard's directory)",
}
"""Dotted config prefixes left out of the HParams, each with the reason."""


def as_trained(run: RunData) -> dict[str, Any]:
    """What the run trained, as dotted keys (module docstring); entries it cannot know are absent."""
    m = run.recorded
    out: dict[str, Any] = {}
    from fathom.config.model_kinds import recorded_model

    recorded = recorded_model(m.config.model.as_json())
    if recorded is not None and recorded[0].widths is not None:
        from fathom.models import kind_function

        out["model.widths"] = list(kind_function(recorded[0].widths)(recorded[1]))
    if m.model.parameters is not None:
        out["model.parameters"] = m.model.parameters
    if m.environment.device is not None:
        out["device"] = m.environment.device
    if m.execution.path is not None:
        out["execution.path"] = m.execution.path
    return out


def _noise(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in NOT_HYPERPARAMETERS)


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: leaf}`` of a nested mapping (lists kept whole)."""
    out: dict[str, Any] = {}
    if isinstance(node, Mapping):
        for k in sorted(node):
            out.update(leaves(node[k], f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = node
    return out


def hparams(run: RunData) -> dict[str, bool | int | float | str]:
    """The run's hyperparameters as trained: the config's leaves less :data:`NOT_HYPERPARAMETERS`
    and unset options, with :func:`as_trained` in place of what it states; a list as JSON text."""
    values = {k: v for k, v in leaves(dict(run.config)).items() if v is not None and not _noise(k)}
    values.update(as_trained(run))
    return {
        k: v if isinstance(v, bool | int | float | str) else json.dumps(v, sort_keys=True)
        for k, v in sorted(values.items())
    }


_TAG_LIMIT = 64  # W&B refuses a longer tag


def run_tags(run: RunData) -> list[str]:
    """Model kind, recipe, dataset, status, phase, then the config's ``tags`` as ``key=value``."""
    cfg = run.recorded.config
    found = [cfg.model.kind, cfg.model.recipe, cfg.data.dataset, run.status, run.phase]
    found += [f"{k}={v}" for k, v in sorted((cfg.tags or {}).items())]
    return list(dict.fromkeys(str(t)[:_TAG_LIMIT] for t in found if t not in (None, "")))


def job_type(run: RunData) -> str:
    """``tuning`` for a study's learning-rate grid run, else ``train``."""
    return run.phase or "train"
