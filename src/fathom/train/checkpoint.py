"""The trainer's view of checkpoints: the model state (:mod:`fathom.rundir.weights`) and the
file formats (:mod:`fathom.rundir.files`) of the run-directory contract."""

from __future__ import annotations

from fathom.rundir.files import load_resume, load_weights, save_resume, save_weights
from fathom.rundir.weights import (
    EXTRA_STATE_SUFFIX,
    cpu_state,
    extra_state,
    load_cpu_state,
    load_extra_state,
)

__all__ = [
    "EXTRA_STATE_SUFFIX",
    "cpu_state",
    "extra_state",
    "load_cpu_state",
    "load_extra_state",
    "load_resume",
    "load_weights",
    "save_resume",
    "save_weights",
]
