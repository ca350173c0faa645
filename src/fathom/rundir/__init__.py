"""The run directory contract's one owner: manifest type, writer (locked, digested,
atomic) and reader. See ``docs/architecture.md`` ("Run directory")."""

from fathom.rundir.errors import os_error
from fathom.rundir.files import load_resume, load_weights, save_resume, save_weights
from fathom.rundir.interrupts import uninterrupted
from fathom.rundir.kinds import register_kind
from fathom.rundir.lock import DirLock, study_lock
from fathom.rundir.manifest import FORMAT, KINDS, PHASES, STATUSES, ManifestHeader, seal
from fathom.rundir.reader import RunDir, Which, find_runs
from fathom.rundir.writer import RunWriter

__all__ = [
    "FORMAT",
    "KINDS",
    "PHASES",
    "STATUSES",
    "DirLock",
    "ManifestHeader",
    "RunDir",
    "RunWriter",
    "Which",
    "find_runs",
    "load_resume",
    "load_weights",
    "os_error",
    "register_kind",
    "save_resume",
    "save_weights",
    "seal",
    "study_lock",
    "uninterrupted",
]
