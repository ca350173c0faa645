"""Reading TOML (configs, pipelines, presets): every failure a :class:`FathomError`.

A file that is missing, a directory, unreadable, not UTF-8, not TOML or nested deeper than
the parser can follow (``tomllib`` recurses once per nested array or inline table and raises
``RecursionError`` a few hundred levels down) is refused naming the file and the fix, never
with a traceback.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from fathom.errors import FathomError, os_error


def parse_toml(text: str, origin: str) -> dict[str, Any]:
    """The tables of ``text``; ``origin`` names it in the error (``"config file 'a.toml'"``)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FathomError(f"{origin} is not valid TOML: {e}; fix the line it names") from None
    except RecursionError:
        raise FathomError(
            f"{origin} nests arrays or inline tables too deeply for the TOML parser (hundreds "
            "of levels); no config needs more than a few: flatten the nested values"
        ) from None


def load_toml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """The tables of the TOML file ``path``; ``what`` names it in errors."""
    path = Path(path)
    origin = f"{what} {str(path)!r}"
    if not path.exists():
        raise FathomError(f"{origin} does not exist; check the path (or name a preset)")
    if path.is_dir():
        found = ", ".join(sorted(p.name for p in path.glob("*.toml"))[:5]) or "no .toml file"
        raise FathomError(
            f"{origin} is a directory, not a TOML file (it holds {found}); pass the path of a "
            ".toml file, or a preset name"
        )
    if not path.is_file():
        raise FathomError(f"{origin} is not a file; pass the path of a .toml file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise os_error(e, f"read {origin}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FathomError(
            f"{origin} is not UTF-8 text (byte {e.start} is 0x{raw[e.start]:02x}); TOML files "
            "are UTF-8: save it as UTF-8 text"
        ) from None
    return parse_toml(text, origin)
