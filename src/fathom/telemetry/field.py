"""One declared telemetry field: name pattern, family, formula, units, scope and caveats.

See :mod:`fathom.telemetry.registry` for the placeholders a pattern may hold and the
scopes; this module holds only the type, so the field declarations
(:mod:`fathom.telemetry.gradient_fields`, :mod:`fathom.telemetry.trainer_fields`) and the
registry that collects them import it without importing each other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

SCOPES: tuple[str, ...] = ("probe", "split", "state", "training", "health_probe")
"""``training``: over an epoch's optimizer steps; ``health_probe``: the health instrument's
probe (the first ``health.probe_size`` validation examples). Both are used by the trainer's
own fields (:mod:`fathom.telemetry.trainer_fields`)."""

QUANTILES: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)
"""The quantiles every distribution field reports (``q05`` ... ``q95``)."""


def quantile_key(q: float) -> str:
    """``0.05 -> "q05"``, ``0.5 -> "q50"``."""
    return f"q{round(q * 100):02d}"


@dataclass(frozen=True)
class Field:
    """One declared field (or family of per-layer / per-class fields)."""

    pattern: str
    family: str
    formula: str
    units: str
    scope: str
    caveats: str = ""
    kind: str = "scalar"  # scalar | matrix (list of lists)

    @property
    def regex(self) -> re.Pattern[str]:
        return _compile(self.pattern)

    def expand(
        self,
        layers: Sequence[str],
        splits: Sequence[str],
        classes: int,
        inputs: Sequence[str] = (),
        blocks: Sequence[str] = (),
    ) -> list[str]:
        """Concrete names for a model with these layer names, input layers, classes and
        residual blocks."""
        names = [self.pattern]
        axes = {
            "{layer}": list(layers),
            "{input}": list(inputs),
            "{block}": list(blocks),
            "{split}": list(splits),
            "{cls}": [str(c) for c in range(classes)],
        }
        for key, values in axes.items():
            names = (
                [n.replace(key, v, 1) for n in names for v in values]
                if any(key in n for n in names)
                else names
            )
        return names


@cache
def _compile(pattern: str) -> re.Pattern[str]:
    rx = re.escape(pattern)
    for key, sub in {
        "{layer}": r"[^/]+",
        "{input}": r"[^/]+",
        "{block}": r"[^/]+",
        "{split}": r"fit|val|test",
        "{cls}": r"\d+",
    }.items():
        rx = rx.replace(re.escape(key), f"(?:{sub})")
    return re.compile(f"^{rx}$")
