"""A data config's relative paths, resolved the same from any working directory.

A config names its data files relative to the directory it was trained from (``data.path``
of a ``tensors`` dataset, ``data.data_dir``). The run records that directory as
``data.info["paths_base"]`` (:func:`paths_base`); a later reader (an analysis, a resume)
resolves each relative path (:func:`resolved_data_config`) against, in order:

1. the recorded base;
2. the current working directory (runs recorded before the base was);
3. the directories above the run directory (``runs/<study>/<run>`` usually lives in the
   project it was trained from).

The first place where the path exists wins; the content is then checked against the recorded
hashes by the caller, so a wrong file found on the way is refused, never used. A ``data.path``
found nowhere is a :class:`FathomError` naming every place tried and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fathom.errors import FathomError

if TYPE_CHECKING:
    from fathom.config import DataConfig

_PATH_FIELDS = ("path", "data_dir")
"""The fields of :class:`~fathom.config.DataConfig` that name a file or a directory."""


_RUN_DIR_LEVELS = 4
"""How many directories above a run directory are tried: its study, the runs directory, the
project holding it, and one more."""


def paths_base(cfg: DataConfig) -> str | None:
    """The directory ``cfg``'s relative paths are relative to (the working directory, made
    absolute); ``None`` when it names no relative path (nothing to record)."""
    relative = [getattr(cfg, k) for k in _PATH_FIELDS if _relative(getattr(cfg, k))]
    return str(Path.cwd().resolve()) if relative else None


def resolved_data_config(
    cfg: DataConfig, base: str | None, run_dir: Path | None = None
) -> DataConfig:
    """``cfg`` with each relative path made absolute (see the module docstring)."""
    updates: dict[str, str] = {}
    for key in _PATH_FIELDS:
        value = getattr(cfg, key)
        if not _relative(value):
            continue
        tried = candidates(str(value), base, run_dir)
        found = next((p for p in tried if p.exists()), None)
        if found is None and key == "path":
            where = ", ".join(repr(str(p.parent)) for p in tried)
            raise FathomError(
                f"data.path {value!r} of the run is relative to the directory it was trained "
                f"from; it is in none of {where}. Put the file back there (its content is "
                "checked against the recorded hash), or run the command from the directory "
                "the run was trained in"
            )
        updates[key] = str(found if found is not None else tried[0])
    return cfg.model_copy(update=updates) if updates else cfg


def candidates(value: str, base: str | None, run_dir: Path | None) -> list[Path]:
    """Where a relative ``value`` may be, in the order of the module docstring (no repeats)."""
    roots = [Path(base)] if base else []
    roots.append(Path.cwd())
    if run_dir is not None:
        roots += list(Path(run_dir).resolve().parents)[:_RUN_DIR_LEVELS]
    out: list[Path] = []
    for root in roots:
        p = (root / Path(value).expanduser()).resolve()
        if p not in out:
            out.append(p)
    return out


def _relative(value: str | None) -> bool:
    return value is not None and not Path(value).expanduser().is_absolute()
