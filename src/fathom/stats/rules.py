"""The inference rules' settings, declared once with their defaults (``docs/statistics.md``).

Every verdict of :mod:`fathom.stats` reads its level, smallest effects of interest,
resolutions and the trained/failed band from one :class:`Rules` object; a caller that wants
other values passes its own (``Rules(accuracy_pp=1.0)``), nothing is a module global.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Rules(BaseModel):
    """Settings of the inference rules (defaults stated in ``docs/statistics.md``).

    * ``level``: nominal two-sided level of every interval before multiplicity correction.
    * ``accuracy_pp``: smallest effect of interest for accuracy, in percentage points.
    * ``ce_nats``: smallest effect of interest for cross entropy, in nats.
    * ``log_ratio``: smallest effect of interest for a ratio, on the natural-log scale
      (``ln 1.05``: a ratio inside ``[1/1.05, 1.05]`` is no effect of interest).
    * ``ce_resolution_nats`` / ``log_ratio_resolution``: the standard-error floor of one
      per-seed difference when the measurement's own standard error is not known (the
      printed resolution of the quantity); accuracy uses the binomial standard error.
    * ``chance_level``: level of the Clopper–Pearson interval of one run's accuracy.
    * ``chance_margin``: a run is *trained* when that interval lies above
      ``1/C + chance_margin · (1 − 1/C)``; it *failed* when the interval reaches down to
      ``1/C``; otherwise it is *undetermined*.
    * ``multiplicity``: ``"holm"`` (the only method; stated in every family's sentence).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: float = Field(0.95, gt=0.0, lt=1.0)
    accuracy_pp: float = Field(0.5, gt=0.0)
    ce_nats: float = Field(0.01, gt=0.0)
    log_ratio: float = Field(math.log(1.05), gt=0.0)
    ce_resolution_nats: float = Field(1e-4, gt=0.0)
    log_ratio_resolution: float = Field(1e-3, gt=0.0)
    chance_level: float = Field(0.95, gt=0.0, lt=1.0)
    chance_margin: float = Field(0.01, ge=0.0, lt=1.0)
    multiplicity: str = "holm"

    @field_validator("multiplicity")
    @classmethod
    def _known_method(cls, v: str) -> str:
        if v != "holm":
            raise ValueError(f"multiplicity {v!r} is unknown; the method is 'holm'")
        return v


DEFAULT_RULES = Rules()
