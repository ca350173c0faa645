"""Epoch-boundary telemetry: instruments, the field registry, the recorder.

Functional core: :mod:`~fathom.telemetry.moments` (per-example gradient moments from
Gram matrices), :mod:`~fathom.telemetry.distributions`, :mod:`~fathom.telemetry.params`,
:mod:`~fathom.telemetry.scores`. Every field is declared once in
:mod:`~fathom.telemetry.registry`; :class:`Recorder` is the thin object the trainer calls.
"""

from fathom.telemetry.instruments import Instruments
from fathom.telemetry.moments import (
    GradientMoments,
    gradient_gram,
    gradient_moments,
    moments_from_gram,
    moments_from_grams,
)
from fathom.telemetry.recorder import Recorder, read_only, schedule_due
from fathom.telemetry.registry import ALIASES, FAMILIES, FIELDS, Field, field_for, resolve_families

__all__ = [
    "ALIASES",
    "FAMILIES",
    "FIELDS",
    "Field",
    "GradientMoments",
    "Instruments",
    "Recorder",
    "field_for",
    "gradient_gram",
    "gradient_moments",
    "moments_from_gram",
    "moments_from_grams",
    "read_only",
    "resolve_families",
    "schedule_due",
]
