"""Directional contrasts: is a measured quantity higher or lower in one arm than another?

For quantities with no "better" direction (a gradient norm, a zero-activation fraction) the
rule is the one of :func:`fathom.stats.verdicts.compare` read as a direction: the paired
95% t interval over seeds decides, failure flags exclude, n < 2 claims nothing. Two scales:

* ``ratio`` (positive quantities: norms, diversity, participation)::

      r_s = a_s / b_s,   l_s = ln r_s,   ratio = exp(mean_s l_s)      (geometric-mean ratio)
      interval = exp(mean(l) ± t_{(1+level)/2, n-1} · sd(l) / √n)

  ``higher`` when the interval lies above 1, ``lower`` when below 1. A value <= 0 in a
  paired seed has no ratio: the contrast is ``no comparison`` and says so.
* ``difference`` (fractions, compared in percentage points after
  :func:`fathom.stats.units.percent`): ``d_s = a_s - b_s``, the paired t interval;
  ``higher`` when above 0, ``lower`` when below.

Verdicts: ``higher`` | ``lower`` | ``not established`` (interval covers the null, or n < 2)
| ``no comparison`` (an arm carries an excluding flag: diverged, at chance, incomplete;
or no paired seed; or a non-positive value on the ratio scale).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fathom.errors import FathomError
from fathom.stats.flags import is_excluded
from fathom.stats.intervals import paired_difference
from fathom.stats.units import percent
from fathom.stats.verdicts import compare

SCALES = ("ratio", "difference")
DIRECTION = {"better": "higher", "worse": "lower"}


@dataclass(frozen=True)
class Contrast:
    """A directional verdict of ``a`` against ``b`` on one scale, with the interval on that
    scale (``estimate``/``low``/``high``; bounds ``None`` when n < 2 or no comparison)."""

    verdict: str
    reason: str
    scale: str
    estimate: float | None
    low: float | None
    high: float | None
    n: int
    level: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


def _excluded(a: str, b: str, flags_a: Sequence[str], flags_b: Sequence[str]) -> str | None:
    """The reason :func:`compare` gives when an arm carries an excluding flag, else None."""
    if not (is_excluded(list(flags_a)) or is_excluded(list(flags_b))):
        return None
    return compare(
        None, higher_is_better=True, flags_a=flags_a, flags_b=flags_b, name_a=a, name_b=b
    ).reason


def contrast(
    a: Mapping[int, float],
    b: Mapping[int, float],
    *,
    scale: str,
    flags_a: Sequence[str] = (),
    flags_b: Sequence[str] = (),
    name_a: str = "a",
    name_b: str = "b",
    level: float = 0.95,
) -> Contrast:
    """Contrast of per-seed values ``a[s]`` against ``b[s]`` (see the module docstring).

    ``flags_a`` / ``flags_b``: the failure flags of each arm's runs (their union over
    seeds); on the ``difference`` scale values are fractions, converted to percent here.
    """
    if scale not in SCALES:
        raise FathomError(f"contrast scale {scale!r} is unknown; use one of {SCALES}")
    null = Contrast("no comparison", "", scale, None, None, None, 0, level)
    why = _excluded(name_a, name_b, flags_a, flags_b)
    if why is not None:
        return Contrast(**{**null.to_dict(), "reason": why})
    common = sorted(set(a) & set(b))
    if not common:
        return Contrast(
            **{**null.to_dict(), "reason": f"no seed measured in both {name_a} and {name_b}"}
        )
    if scale == "ratio":
        bad = [s for s in common if not (a[s] > 0 and b[s] > 0)]
        if bad:
            return Contrast(
                **{
                    **null.to_dict(),
                    "n": len(common),
                    "reason": f"a value <= 0 at seed(s) {bad}: no ratio",
                }
            )
        diff = paired_difference(
            {s: math.log(a[s]) for s in common}, {s: math.log(b[s]) for s in common}, level
        )
        back = math.exp
    else:
        diff = paired_difference(
            {s: percent(a[s]) for s in common}, {s: percent(b[s]) for s in common}, level
        )
        back = float
    v = compare(
        diff, higher_is_better=True, flags_a=flags_a, flags_b=flags_b, name_a=name_a, name_b=name_b
    )
    return Contrast(
        DIRECTION.get(v.verdict, v.verdict),
        v.reason,
        scale,
        back(diff.estimate),
        None if diff.low is None else back(diff.low),
        None if diff.high is None else back(diff.high),
        diff.n,
        level,
    )


def _num(x: float, scale: str) -> str:
    return f"{x:.3g}" if scale == "ratio" else f"{x:+.2f}"


def _interval(c: Contrast) -> str:
    text = _num(c.estimate, c.scale)  # type: ignore[arg-type]
    unit = "" if c.scale == "ratio" else " pp"
    if c.low is None or c.high is None:
        return f"{c.scale} {text}{unit}"
    return f"{c.scale} {text}{unit} [{_num(c.low, c.scale)}, {_num(c.high, c.scale)}]"


def contrast_sentence(c: Contrast, *, name_a: str, name_b: str, quantity: str, epoch: int) -> str:
    """The one sentence a report prints for a :func:`contrast`, for example::

    "plain's head-layer ‖mean g‖ is lower than residual's at epoch 5: ratio 0.31
     [0.22, 0.43] (n = 3 seeds)."
    "plain vs residual, head-layer diversity D at epoch 5: not established, ratio 0.91
     [0.55, 1.5] (n = 3 seeds; the interval includes 1)."
    "plain vs residual, ... at epoch 5: not established, ratio 0.8 (n = 1 seed: no interval)."
    "plain vs residual, ... at epoch 5: no comparison (plain excluded (diverged))."
    """
    seeds = f"n = {c.n} seed{'s' if c.n != 1 else ''}"
    if c.verdict in ("higher", "lower"):
        return f"{name_a}'s {quantity} is {c.verdict} than {name_b}'s at epoch {epoch}: {_interval(c)} ({seeds})."
    head = f"{name_a} vs {name_b}, {quantity} at epoch {epoch}"
    if c.verdict == "no comparison" or c.estimate is None:
        return f"{head}: no comparison ({c.reason})."
    null = "1" if c.scale == "ratio" else "0"
    why = "no interval" if c.low is None else f"the interval includes {null}"
    return f"{head}: not established, {_interval(c)} ({seeds}: {why})."
