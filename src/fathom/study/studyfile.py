"""``<study>/study.json``: the definition a study ran with, written and read back.

The file holds ``{"config": StudyConfig.to_data(), "config_hash", "origin"}``. What is written
validates back to the same :class:`~fathom.study.config.StudyConfig` and ``config_hash``
(tests/test_config_roundtrip.py). Files written before that held (``tuning.enabled = true``
beside ``mode = "frozen"``, where ``enabled`` never had an effect) are read as the frozen
study they describe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fathom.base.io import atomic_write_json, config_digest
from fathom.errors import FathomError
from fathom.study.config import StudyConfig, validate_study_config

STUDY_FILE = "study.json"


def study_file_data(study: StudyConfig, origin: str) -> dict[str, Any]:
    """The contents of ``study.json``; ``config_hash`` = :func:`fathom.base.io.config_digest` of
    :meth:`StudyConfig.to_data`."""
    data = study.to_data()
    return {"config": data, "config_hash": config_digest(data), "origin": origin}


def write_study_file(root: Path, study: StudyConfig, origin: str) -> None:
    atomic_write_json(root / STUDY_FILE, study_file_data(study, origin))


def _legacy_frozen(config: dict[str, Any]) -> dict[str, Any]:
    """A frozen study written with ``tuning.enabled = true`` (older Fathom wrote the field's
    default there; it never ran a grid) as the ``enabled = false`` it meant."""
    tuning = config.get("tuning")
    if isinstance(tuning, dict) and tuning.get("mode") == "frozen" and tuning.get("enabled"):
        return {**config, "tuning": {**tuning, "enabled": False}}
    return config


def read_study_file(root: Path) -> StudyConfig:
    """The study recorded in ``root/study.json``; a FathomError if absent, corrupt or invalid."""
    path = Path(root) / STUDY_FILE
    if not path.exists():
        raise FathomError(
            f"{str(root)!r} is not a study directory (no {STUDY_FILE}); pass runs/<study> "
            "as created by `fathom study run`"
        )
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        config = stored["config"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise FathomError(
            f"{str(path)!r} is unreadable or corrupt ({type(e).__name__}); delete it and rerun "
            "`fathom study run` with the study's TOML (the run directories are kept)"
        ) from None
    if not isinstance(config, dict):
        raise FathomError(f"{str(path)!r} holds no study definition; delete it and rerun")
    return validate_study_config(_legacy_frozen(config), origin=str(path))
