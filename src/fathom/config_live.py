"""The ``[live]`` section of run and study configs: live tracking to TensorBoard and W&B.

```toml
[live]
backends = ["tensorboard", "wandb"]    # off by default (empty)

[live.wandb]
project = "my-project"                 # default: the study name
entity = "my-team"                     # default: W&B's default entity (online only)
mode = "offline"                       # offline: no server, no account; `wandb sync` later

[live.tensorboard]
log_dir = "tb"                         # default: RUN_DIR/live/tensorboard/<run_id>/
```

With ``log_dir`` each run writes ``<log_dir>/<study>/<run_id>/`` (``tensorboard --logdir
<log_dir>`` names it ``<study>/<run_id>``); a relative ``log_dir`` is relative to the
current directory. There is no flush interval to choose: a run writes one history row per
epoch, and each row is flushed to the log as soon as it is on disk.

Live tracking never changes training, so this section is not part of the training
config: :class:`fathom.config.RunConfig` and :class:`fathom.study.config.StudyConfig` hold
it as an *excluded* field, absent from ``model_dump()``, from the manifest's ``config`` and
from ``config_hash`` (a run with and without ``[live]`` has the same hash and trains the
same bytes). The manifest records the settings a run was tracked with under ``live``; the
CLI flag ``--live`` overrides ``backends``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from fathom.config_export import live_targets
from fathom.config_models import _Strict

_WANDB_FORBIDDEN = set("/\\#?%:")  # characters W&B refuses in project and entity names


class WandbLiveConfig(_Strict):
    """W&B run placement: ``project`` (default: the study name), ``entity``, ``mode``.

    ``offline`` writes the run under ``RUN_DIR/live/wandb/`` with no server or account
    (``wandb sync`` uploads it later); ``online`` also streams to the server of the
    logged-in account (``wandb login``) and keeps the same local record for the read-back.
    """

    project: str | None = Field(default=None, min_length=1, max_length=128)
    entity: str | None = Field(default=None, min_length=1, max_length=128)
    mode: Literal["offline", "online"] = "offline"

    @field_validator("project", "entity")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        bad = sorted(set(v or "") & _WANDB_FORBIDDEN)
        if bad or (v is not None and v != v.strip()):
            raise ValueError(
                f"{v!r} is not a W&B name: no surrounding spaces and none of {''.join(sorted(_WANDB_FORBIDDEN))}"
            )
        return v


class TensorBoardLiveConfig(_Strict):
    """``log_dir``: a shared TensorBoard directory (``<log_dir>/<study>/<run_id>/``)."""

    log_dir: str | None = Field(default=None, min_length=1)


def _live_backend(name: str) -> str:
    """A backend of :data:`fathom.config_export.EXPORT_TARGETS` with ``live``."""
    if name not in live_targets():
        raise ValueError(f"{name!r} is not a live backend; use one of {', '.join(live_targets())}")
    return name


class LiveConfig(_Strict):
    """Which backends stream the history rows while a run trains (none by default)."""

    backends: tuple[Annotated[str, AfterValidator(_live_backend)], ...] = ()
    wandb: WandbLiveConfig = WandbLiveConfig()
    tensorboard: TensorBoardLiveConfig = TensorBoardLiveConfig()

    @field_validator("backends")
    @classmethod
    def _unique(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError(f"live.backends lists a backend twice: {list(v)}")
        return v

    @property
    def enabled(self) -> bool:
        return bool(self.backends)

    def with_backends(self, backends: tuple[str, ...]) -> LiveConfig:
        """A copy streaming to ``backends`` (the CLI's ``--live``), re-validated."""
        return LiveConfig.model_validate({**self.model_dump(), "backends": backends})


def live_config(spec: LiveConfig | Sequence[str]) -> LiveConfig:
    """``spec`` itself, or default settings streaming to the backends it lists."""
    if isinstance(spec, LiveConfig):
        return spec
    return LiveConfig().with_backends(tuple(spec))
