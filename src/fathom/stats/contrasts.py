"""Directional contrasts: is a measured quantity higher or lower in one arm than another?

For quantities with no "better" direction (a gradient norm, a zero-activation fraction) the
rule is :mod:`fathom.stats.inference`'s, with the words *higher* / *lower*: paired over seeds,
a resolution floor, a smallest effect of interest, leave-one-seed-out. Two scales:

* ``ratio`` (positive quantities: norms, diversity, participation): ``l_s = ln a_s − ln b_s``,
  the geometric-mean ratio ``exp(mean l)`` and its interval ``exp(CI(l))``; region of no
  interest ``[1/1.05, 1.05]`` (``Rules.log_ratio``), resolution ``Rules.log_ratio_resolution``.
  A value <= 0 in a seed has no ratio: ``no comparison``, saying so.
* ``difference`` (fractions, compared in percentage points after
  :func:`fathom.base.units.percent`): ``d_s = a_s − b_s``; region ``±Rules.accuracy_pp``.

Verdicts: ``higher`` | ``lower`` | ``equivalent`` | ``not established`` (n < 2 included) |
``no comparison`` (an excluding failure flag, unequal seeds, a missing or non-finite value,
no ratio), naming the reason; bad values never raise.
Each call is a family of one; a table printing several together re-judges them as one Holm
family (:func:`judge_contrast_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fathom.base.units import percent
from fathom.errors import FathomError
from fathom.stats.flags import EXCLUDING_FLAGS
from fathom.stats.inference import Paired, judge, paired, rejudge_input
from fathom.stats.quantities import ratio
from fathom.stats.results import Comparison, Quantity
from fathom.stats.rules import DEFAULT_RULES, Rules
from fathom.stats.sentences import comparison_sentence

_SCALES = ("ratio", "difference")


@dataclass(frozen=True)
class Contrast:
    """A directional verdict of ``a`` against ``b`` on one scale, with the interval on that
    scale (``estimate``/``low``/``high``: a ratio or pp; bounds ``None`` when n < 2 or no
    comparison) and the judged :class:`~fathom.stats.results.Comparison`."""

    verdict: str
    reason: str
    scale: str
    estimate: float | None
    low: float | None
    high: float | None
    n: int
    level: float | None
    comparison: Comparison

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        out = asdict(self)
        out["comparison"] = self.comparison.to_dict()
        return out


def _quantity(scale: str, rules: Rules) -> Quantity:
    if scale == "ratio":
        return ratio("ratio", rules)
    return Quantity(
        name="difference",
        unit="pp",
        higher_is_better=None,
        smallest_effect=rules.accuracy_pp,
        resolution=0.01,
    )


def _blocked(a: str, b: str, flags_a: Sequence[str], flags_b: Sequence[str]) -> str | None:
    parts = [
        f"{name} excluded ({', '.join(sorted({f for f in fl if f in EXCLUDING_FLAGS}))})"
        for name, fl in ((a, flags_a), (b, flags_b))
        if any(f in EXCLUDING_FLAGS for f in fl)
    ]
    return "; ".join(parts) or None


def _contrast_item(
    cid: str,
    a: Mapping[int, float | None],
    b: Mapping[int, float | None],
    *,
    scale: str,
    flags_a: Sequence[str] = (),
    flags_b: Sequence[str] = (),
    name_a: str = "a",
    name_b: str = "b",
    rules: Rules = DEFAULT_RULES,
) -> Paired:
    """The comparison input of one contrast (see the module docstring)."""
    if scale not in _SCALES:
        raise FathomError(f"contrast scale {scale!r} is unknown; use one of {_SCALES}")
    q = _quantity(scale, rules)
    blocked = _blocked(name_a, name_b, flags_a, flags_b)
    if blocked is None and not set(a) & set(b):
        blocked = f"no seed measured in both {name_a} and {name_b}"
    if blocked is None and scale == "ratio":
        bad = sorted({s for v in (a, b) for s, x in v.items() if _finite(x) and x <= 0})
        if bad:
            blocked = f"a value <= 0 at seed(s) {bad}: no ratio"
    conv = (lambda x: math.log(x)) if scale == "ratio" else percent
    if blocked is None:  # a missing or non-finite value stays as it is: paired() names it
        a = {s: conv(v) if _finite(v) else v for s, v in a.items()}
        b = {s: conv(v) if _finite(v) else v for s, v in b.items()}
    return paired(cid, q, a, b, names=(name_a, name_b), blocked=blocked)


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(float(x))


def _from_comparison(c: Comparison) -> Contrast:
    """The :class:`Contrast` view of a judged comparison (ratios back from the log scale)."""
    back = math.exp if c.quantity.scale == "log ratio" else float
    scale = "ratio" if c.quantity.scale == "log ratio" else "difference"

    def conv(x: float | None) -> float | None:
        return None if x is None else back(x)

    return Contrast(
        c.verdict, c.reason, scale, conv(c.estimate), conv(c.low), conv(c.high), c.n, c.level, c
    )


def contrast(
    a: Mapping[int, float],
    b: Mapping[int, float],
    *,
    scale: str,
    flags_a: Sequence[str] = (),
    flags_b: Sequence[str] = (),
    name_a: str = "a",
    name_b: str = "b",
    rules: Rules = DEFAULT_RULES,
) -> Contrast:
    """Contrast of per-seed values ``a[s]`` against ``b[s]`` (a family of one)."""
    item = _contrast_item(
        "contrast",
        a,
        b,
        scale=scale,
        flags_a=flags_a,
        flags_b=flags_b,
        name_a=name_a,
        name_b=name_b,
        rules=rules,
    )
    return _from_comparison(judge("contrast", [item], rules)[0])


def contrast_sentence(c: Contrast, *, name_a: str, name_b: str, quantity: str, epoch: int) -> str:
    """The one sentence a report prints for a :func:`contrast`, for example::

    "plain vs residual on head-layer ‖mean g‖ (epoch 5): lower (ratio 0.31×, 95% interval
     [0.22×, 0.43×], paired over n=3 seeds; outside the region of no interest [0.952×, 1.05×] ...)."
    """
    q = c.comparison.quantity.model_copy(update={"name": quantity})
    named = c.comparison.model_copy(
        update={"quantity": q, "a": name_a, "b": name_b, "context": {"scope": f"epoch {epoch}"}}
    )
    return comparison_sentence(named).text


def judge_contrast_rows(rows: Sequence[dict[str, Any]], family: str) -> list[dict[str, Any]]:
    """Re-judge contrast rows printed together as one Holm family.

    Each row holds ``comparison`` (from :meth:`Contrast.to_dict`), ``recipe``, ``reference``,
    ``label`` and ``epoch``; the returned rows carry the family's verdicts, intervals and
    sentences (the per-row judgments were families of one).
    """
    comps = [Comparison.model_validate(r["comparison"]) for r in rows]
    items = [rejudge_input(c, f"{family}#{i}") for i, c in enumerate(comps)]
    out = []
    for row, c in zip(rows, judge(family, items)):
        view = _from_comparison(c)
        sentence = contrast_sentence(
            view,
            name_a=row["recipe"],
            name_b=row["reference"],
            quantity=row["label"],
            epoch=row["epoch"],
        )
        out.append({**row, **view.to_dict(), "sentence": sentence})
    return out
