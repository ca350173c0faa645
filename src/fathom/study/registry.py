"""The run registry: a SQLite index (WAL mode) of every run under a runs directory.

One file, ``<runs-dir>/registry.sqlite``, indexes the runs of every study below that
directory (the ``study`` column tells them apart). It is an index, not the evidence: the
run directories are; a study rerun re-indexes each of its runs, so a registry moved aside
is rebuilt by running the study again.

Paths are stored relative to the registry's folder (``main-plain-s101`` of study ``s`` is
``s/main-plain-s101``), so a runs folder moved or copied elsewhere still resolves its runs
(:meth:`Registry.run_dir`); ``updated_at`` is an ISO 8601 UTC time
(``2026-12-01T22:10:03+00:00``). A file of schema 1 (absolute paths, Unix times) is
converted on opening.

Several processes may write at once: each write is one ``BEGIN IMMEDIATE`` transaction
(an upsert of whole rows), and a writer waits up to ``busy_timeout_s`` for the lock. A
locked or corrupt file raises :class:`FathomError`; a failed transaction is rolled back,
so a row is either written whole or not at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fathom.errors import FathomError

_REGISTRY_FILE = "registry.sqlite"
_SCHEMA_VERSION = 2
"""Stored as SQLite ``user_version``; 2: relative ``directory``, ISO ``updated_at``."""

COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "TEXT NOT NULL"),
    ("study", "TEXT NOT NULL"),
    ("phase", "TEXT NOT NULL"),
    ("recipe", "TEXT NOT NULL"),
    ("seed", "INTEGER NOT NULL"),
    ("lr", "REAL NOT NULL"),
    ("status", "TEXT NOT NULL"),
    ("status_reason", "TEXT"),
    ("config_hash", "TEXT"),
    ("directory", "TEXT NOT NULL"),
    ("epochs_completed", "INTEGER"),
    ("diverged_epoch", "INTEGER"),
    ("selected_epoch", "INTEGER"),
    ("selected_val_ce", "REAL"),
    ("selected_test_acc", "REAL"),
    ("selected_test_ce", "REAL"),
    ("final_epoch", "INTEGER"),
    ("final_val_ce", "REAL"),
    ("final_test_acc", "REAL"),
    ("final_test_ce", "REAL"),
    ("final_params", "TEXT"),
    ("training_s", "REAL"),
    ("elapsed_s", "REAL"),
    ("updated_at", "TEXT NOT NULL"),
)
COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in COLUMNS)
_FILTERS: tuple[str, ...] = ("study", "phase", "recipe", "seed", "status")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS runs ("
    + ", ".join(f"{n} {t}" for n, t in COLUMNS)
    + ", PRIMARY KEY (study, run_id))"
)
_INSERT = (
    f"INSERT OR REPLACE INTO runs ({', '.join(COLUMN_NAMES)}) "
    f"VALUES ({', '.join(':' + c for c in COLUMN_NAMES)})"
)


def registry_path(runs_dir: str | Path) -> Path:
    return Path(runs_dir) / _REGISTRY_FILE


def _now_iso() -> str:
    """The current time, ISO 8601 in UTC to the second: ``2026-12-01T22:10:03+00:00``."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def _iso(value: Any) -> str:
    """A stored time as ISO 8601 UTC (schema 1 stored Unix seconds)."""
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC).isoformat(timespec="seconds")
    return str(value)


def _relative_directory(directory: str | Path, root: Path) -> str:
    """``directory`` relative to ``root`` (POSIX separators) when inside it, else absolute."""
    path = Path(directory)
    if not path.is_absolute():
        return path.as_posix()
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path.resolve())


def _error(path: Path, e: sqlite3.Error, doing: str) -> FathomError:
    text = str(e)
    if "locked" in text or "busy" in text:
        return FathomError(
            f"run registry {str(path)!r} is locked ({text}) while {doing}: another process holds "
            "it longer than the busy timeout. Wait for it to finish (or stop it) and run again; "
            "nothing was written"
        )
    if (isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.OperationalError)) or (
        "malformed" in text or "not a database" in text
    ):
        return FathomError(
            f"run registry {str(path)!r} is corrupt ({text}); nothing was written. Move it aside "
            "(e.g. `mv registry.sqlite registry.sqlite.bad`) and rerun the study: it re-indexes "
            "every run from its run directory"
        )
    return FathomError(f"run registry {str(path)!r}: {text} while {doing}; nothing was written")


class Registry:
    """Open (creating if needed) the registry file at ``path``."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        with self._connect("opening") as con:
            try:
                con.execute("PRAGMA journal_mode=WAL")
                con.execute(_SCHEMA)
                names = [row[1] for row in con.execute("PRAGMA table_info(runs)")]
            except sqlite3.Error as e:
                raise _error(self.path, e, "opening") from None
            if tuple(names) == COLUMN_NAMES:
                self._migrate(con)
            if tuple(names) != COLUMN_NAMES:
                raise FathomError(
                    f"run registry {str(self.path)!r} has columns {names}, not the expected "
                    f"{list(COLUMN_NAMES)} (another version wrote it). Move it aside and rerun "
                    "the study to rebuild it"
                )

    def _migrate(self, con: sqlite3.Connection) -> None:
        """Schema 1 -> 2 in one transaction: relative directories, ISO times, TEXT column."""
        if con.execute("PRAGMA user_version").fetchone()[0] >= _SCHEMA_VERSION:
            return
        con.execute("BEGIN IMMEDIATE")
        try:
            if con.execute("PRAGMA user_version").fetchone()[0] >= _SCHEMA_VERSION:
                con.execute("COMMIT")  # another process converted it meanwhile
                return
            con.row_factory = sqlite3.Row
            rows = [dict(r) for r in con.execute("SELECT * FROM runs")]
            con.row_factory = None
            con.execute("DROP TABLE runs")
            con.execute(_SCHEMA)
            for r in rows:
                r["directory"] = _relative_directory(r["directory"], self.path.parent)
                r["updated_at"] = _iso(r["updated_at"])
            con.executemany(_INSERT, rows)
            con.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    def run_dir(self, row: Mapping[str, Any]) -> Path:
        """The run directory of a registry row, wherever the runs folder now lies."""
        return self.path.parent / row["directory"]

    @contextmanager
    def _connect(self, doing: str) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            con = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        except sqlite3.Error as e:
            raise _error(self.path, e, doing) from None
        try:
            con.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            yield con
        except sqlite3.Error as e:
            raise _error(self.path, e, doing) from None
        finally:
            con.close()

    def upsert(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert or replace whole rows in one transaction (all rows or none)."""
        stamped = []
        for row in rows:
            missing = [c for c in COLUMN_NAMES if c != "updated_at" and c not in row]
            if missing:
                raise FathomError(f"registry row {row.get('run_id')!r} lacks columns {missing}")
            stamped.append(
                {
                    **{c: row.get(c) for c in COLUMN_NAMES},
                    "directory": _relative_directory(row["directory"], self.path.parent),
                    "updated_at": _now_iso(),
                }
            )
        with self._connect("writing") as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                con.executemany(_INSERT, stamped)
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def query(self, **filters: Any) -> list[dict[str, Any]]:
        """Rows matching every given filter (``study``, ``phase``, ``recipe``, ``seed``, ``status``)."""
        unknown = [k for k in filters if k not in _FILTERS]
        if unknown:
            raise FathomError(
                f"unknown registry filters {unknown}; valid filters: {list(_FILTERS)}"
            )
        where = [f"{k} = :{k}" for k, v in filters.items() if v is not None]
        sql = "SELECT * FROM runs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY study, phase DESC, recipe, seed, lr"
        with self._connect("reading") as con:
            con.row_factory = sqlite3.Row
            return [
                dict(r)
                for r in con.execute(sql, {k: v for k, v in filters.items() if v is not None})
            ]

    def get(self, run_id: str, study: str | None = None) -> list[dict[str, Any]]:
        """Rows with this run id (one per study holding it)."""
        sql = "SELECT * FROM runs WHERE run_id = :run_id" + (" AND study = :study" if study else "")
        with self._connect("reading") as con:
            con.row_factory = sqlite3.Row
            return [dict(r) for r in con.execute(sql, {"run_id": run_id, "study": study})]
