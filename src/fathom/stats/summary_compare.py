"""The summary's comparisons: every recipe against the reference, per checkpoint and
metric, as one family for :func:`fathom.stats.inference.judge`, and their JSON rows.

Accuracy (a fraction in the records) is compared in percentage points (each value through
:func:`fathom.base.units.percent`) with the binomial resolution of its test set; CE in nats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fathom.base.units import percent
from fathom.stats.flags import is_excluded
from fathom.stats.inference import Paired, paired
from fathom.stats.quantities import accuracy, accuracy_variance_pp, cross_entropy
from fathom.stats.results import Comparison

COMPARED_METRICS = (
    # (metric key, label, higher is better)
    ("test_acc", "test accuracy", True),
    ("test_ce", "test CE", False),
)
# Paired differences are reported in these units: accuracy (a fraction in the records) in
# percentage points (each value through :func:`percent`, so differences are in pp), CE in
# nats. ``_DIFF_CONVERT[key](a) - _DIFF_CONVERT[key](b)``.
_DIFF_CONVERT = {"test_acc": percent, "test_ce": float}
_DIFF_UNIT = {"test_acc": "percentage points", "test_ce": "nats"}
CHECKPOINTS = ("selected", "final")

FAMILY = "main phase"


def paired_items(
    names: list[str],
    reference: str,
    usable: Mapping[str, Sequence[Any]],
    flags: Mapping[str, Mapping[int, list[str]]],
) -> list[Paired]:
    """Every recipe against the reference, per checkpoint and metric (one family)."""
    items = []
    excluded = {
        n: sorted({f for fl in flags[n].values() for f in fl if is_excluded([f])}) for n in names
    }
    for n in names[1:]:
        blocked = (
            "; ".join(
                f"{who} excluded ({', '.join(excluded[who])})"
                for who in (n, reference)
                if excluded[who]
            )
            or None
        )
        for where in CHECKPOINTS:
            for key, label, _ in COMPARED_METRICS:
                context = {"recipe": n, "metric": key, "checkpoint": where}
                items.append(
                    metric_item(
                        f"{n}/{where}/{key}",
                        (n, reference),
                        where,
                        (key, label),
                        usable,
                        blocked=blocked,
                        context={**context, **_caveat(flags, (n, reference))},
                    )
                )
    return items


def metric_item(
    cid: str,
    names: tuple[str, str],
    where: str,
    metric: tuple[str, str],
    usable: Mapping[str, Sequence[Any]],
    *,
    blocked: str | None = None,
    context: Mapping[str, str] | None = None,
) -> Paired:
    """Recipe ``names[0]`` against ``names[1]`` on ``metric`` (key, label) at checkpoint
    ``where``, paired over the seeds of their ``usable`` runs: accuracy in pp with the
    binomial variance of each run's test set, CE in nats."""
    key, label = metric
    q = (accuracy if key == "test_acc" else cross_entropy)(f"{label} ({where} checkpoint)")
    conv = _DIFF_CONVERT[key]
    a, b = (_values(usable[x], where, key) for x in names)
    var = {
        x: {r.seed: accuracy_variance_pp(r.n_test) if key == "test_acc" else 0.0 for r in usable[x]}
        for x in names
    }
    return paired(
        cid,
        q,
        {s: None if v is None else conv(v) for s, v in a.items()},
        {s: None if v is None else conv(v) for s, v in b.items()},
        names=names,
        var_a=var[names[0]],
        var_b=var[names[1]],
        blocked=blocked,
        context=context,
    )


def row(c: Comparison, sentence: str) -> dict[str, Any]:
    """The JSON row of one comparison (renderers read these fields, never the sentence)."""
    diff = c.diff_record()
    if diff is not None:
        diff["method"] = "paired t, resolution floor, Holm"
    return {
        "recipe": c.context["recipe"],
        "reference": c.b,
        "metric": c.context["metric"],
        "unit": _DIFF_UNIT[c.context["metric"]],
        "checkpoint": c.context["checkpoint"],
        "higher_is_better": c.quantity.higher_is_better,
        "verdict": c.verdict,
        "fragile": c.fragile,
        "reason": c.reason,
        "smallest_effect": c.quantity.smallest_effect,
        "diff": diff,
        "sentence": sentence,
    }


def _values(runs: Sequence[Any], where: str, key: str) -> dict[int, float | None]:
    return {r.seed: getattr(r, where)[key] for r in runs}


_CAVEATS = {"not_fitting": "not fitting", "ce_near_chance": "fitting CE near ln C"}


def _caveat(flags: Mapping[str, Mapping[int, list[str]]], names: tuple[str, ...]) -> dict[str, str]:
    """``{"caveat": "caveat: sd not fitting"}`` when an arm carries a caveat flag, else ``{}``."""
    parts = [
        f"{n} {text}"
        for n in names
        for f, text in _CAVEATS.items()
        if any(f in fl for fl in flags[n].values())
    ]
    return {"caveat": "caveat: " + ", ".join(parts)} if parts else {}
