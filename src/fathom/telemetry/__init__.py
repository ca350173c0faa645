"""Epoch-boundary telemetry: instruments, the field registry, the recorder.

Functional core: :mod:`~fathom.telemetry.moments` (per-example gradient moments from
Gram matrices), :mod:`~fathom.telemetry.distributions`, :mod:`~fathom.telemetry.params`,
:mod:`~fathom.telemetry.scores`. Every field is declared once in
:mod:`~fathom.telemetry.registry`; :class:`Recorder` is the thin object the trainer calls.
"""

from fathom.lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "fathom.telemetry.instruments": ["Instruments"],
        "fathom.telemetry.moments": [
            "GradientMoments",
            "gradient_gram",
            "gradient_moments",
            "moments_from_gram",
            "moments_from_grams",
        ],
        "fathom.config_models": ["schedule_due"],
        "fathom.telemetry.recorder": ["Recorder", "read_only"],
        "fathom.telemetry.registry": [
            "ALIASES",
            "FAMILIES",
            "FIELDS",
            "Field",
            "field_for",
            "resolve_families",
        ],
    },
)
