"""Across seeds and recipes: intervals over seeds, paired damage differences, verdicts.

Inputs are the per-run records written by :mod:`fathom.audit.run` (one per run, holding
one record per audited checkpoint). An *arm* is a recipe (or, when two runs of a recipe
share a seed, a recipe plus its config digest). Every value is a mean over an arm's seeds
with a 95% Student-t interval (:func:`fathom.stats.t_interval`); recipe differences are
paired by seed and judged by :func:`fathom.stats.judge` (resolution floor, smallest effect
of interest, Holm over the comparisons of one checkpoint printed together, leave-one-seed-out;
``docs/statistics.md``). Per-arm intervals over seeds are descriptive.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fathom.base.units import percent
from fathom.errors import FathomError
from fathom.stats import Quantity, judge, paired, t_interval
from fathom.stats.flags import EXCLUDING_FLAGS
from fathom.stats.quantities import cross_entropy
from fathom.stats.rules import DEFAULT_RULES
from fathom.stats.sentences import comparison_sentence

_Getter = Callable[[Mapping[str, Any]], float | None]


def _interval(values: Mapping[int, float | None], level: float = 0.95) -> dict[str, Any] | None:
    """``t_interval`` of the defined values (``None`` when no seed has one)."""
    xs = [v for v in values.values() if v is not None]
    if not xs:
        return None
    out = t_interval(xs, level).to_dict()
    out["seeds_undefined"] = len(values) - len(xs)
    return out


def _by_seed(arm: Mapping[int, Mapping[str, Any]], get: _Getter) -> dict[int, float | None]:
    out: dict[int, float | None] = {}
    for seed, rec in arm.items():
        try:
            out[seed] = get(rec)
        except (KeyError, TypeError, IndexError):
            out[seed] = None
    return out


def _group_arms(runs: Sequence[Mapping[str, Any]], which: str) -> dict[str, dict[int, dict]]:
    """``{arm: {seed: checkpoint record + run identity}}`` for runs audited at ``which``."""
    arms: dict[str, dict[int, dict]] = {}
    for run in runs:
        rec = run["checkpoints"].get(which)
        if rec is None or "missing" in rec:
            continue
        entry = dict(rec, run_id=run["run_id"], seed=run["seed"], flags=run["flags"])
        arms.setdefault(run["arm"], {})[run["seed"]] = entry
    return arms


def _arm_flags(arm: Mapping[int, Mapping[str, Any]], which: str) -> list[str]:
    return sorted({f for rec in arm.values() for f in rec["flags"].get(which, [])})


def _arm_summary(arm: Mapping[int, Mapping[str, Any]], which: str) -> dict[str, Any]:
    """Intervals over seeds of every per-checkpoint quantity of one arm."""
    any_rec = next(iter(arm.values()))
    k = any_rec["k"]
    summary: dict[str, Any] = {
        "inputs": [
            {
                "run_id": r["run_id"],
                "seed": s,
                "params_sha256": r["params_sha256"],
                "epoch": r["epoch"],
            }
            for s, r in sorted(arm.items())
        ],
        "flags": _arm_flags(arm, which),
        "k": k,
    }
    full = any_rec["full_mask"]

    def full_row(split: str, key: str) -> _Getter:
        return lambda r: next(m for m in r["masks"] if m["mask"] == full)[split][key]

    summary["full"] = {
        f"{split}_{key}": _interval(_by_seed(arm, full_row(split, key)))
        for split in ("val", "test")
        for key in ("acc", "ce")
    }
    summary["by_size"] = {
        size: {
            f"{split}_{key}": _interval(
                _by_seed(
                    arm, lambda r, size=size, split=split, key=key: r["by_size"][size][split][key]
                )
            )
            for split in ("val", "test")
            for key in ("acc", "ce", "damage")
        }
        | {"n_masks": any_rec["by_size"][size]["n_masks"]}
        for size in any_rec["by_size"]
    }
    summary["branches"] = [
        {
            "branch": b["branch"],
            "branch_macs": b["branch_macs"],
            "branch_macs_fraction": b["branch_macs_fraction"],
        }
        | {
            f"{split}_{key}": _interval(
                _by_seed(arm, lambda r, i=i, split=split, key=key: r["branches"][i][split][key])
            )
            for split in ("val", "test")
            for key in ("acc", "damage")
        }
        for i, b in enumerate(any_rec["branches"])
    ]
    summary["interactions"] = {
        f"{split}_mean_fraction": _interval(
            _by_seed(arm, lambda r, split=split: r["interactions"][split]["mean_fraction"])
        )
        for split in ("val", "test")
    }
    res: dict[str, Any] = {"keep": any_rec["resilience"]["keep"]}
    for split in ("val", "test"):
        for kind in ("raw", "standardized"):
            res[f"{split}_contrast_{kind}"] = _interval(
                _by_seed(arm, lambda r, s=split, c=kind: r["resilience"][s][f"contrast_{c}"])
            )
        classes = len(any_rec["resilience"][split]["class_means"])
        res[f"{split}_class_means"] = [
            _interval(_by_seed(arm, lambda r, s=split, c=c: r["resilience"][s]["class_means"][c]))
            for c in range(classes)
        ]
    summary["resilience"] = res
    summary["routing"] = _routing_arm_summary(arm, which)
    return summary


def _routing_arm_summary(arm: Mapping[int, Mapping[str, Any]], which: str) -> dict[str, Any] | None:
    """Tolerance held (count), cost, accuracy, control comparison and the verdict."""
    routed = {s: r["routing"] for s, r in arm.items() if r["routing"]}
    if not routed:
        return None
    router_err = {s: percent(r["test"]["error"]) for s, r in routed.items()}
    control_err = {s: percent(r["control"]["control_error_mean"]) for s, r in routed.items()}
    q = Quantity(
        name="test error",
        unit="pp",
        higher_is_better=False,
        smallest_effect=DEFAULT_RULES.accuracy_pp,
        resolution=0.01,
    )
    item = paired(
        "routing",
        q,
        router_err,
        control_err,
        names=("router", "matched-cost shuffled control"),
        blocked=_blocked("router", _arm_flags(arm, which)),
    )
    (verdict,) = judge("routing", [item])
    return {
        "tolerance_held": sum(r["test"]["tolerance_held"] for r in routed.values()),
        "static_tolerance_held": sum(
            r["static"]["test"]["tolerance_held"] for r in routed.values()
        ),
        "runs": len(routed),
        "runs_beating_control": sum(r["control"]["beats_control"] for r in routed.values()),
        "test_accuracy": _interval({s: r["test"]["accuracy"] for s, r in routed.items()}),
        "test_cost_fraction": _interval({s: r["test"]["cost_fraction"] for s, r in routed.items()}),
        "control_accuracy": _interval({s: 1 - v for s, v in control_err.items()}),
        "static_test_accuracy": _interval(
            {s: r["static"]["test"]["accuracy"] for s, r in routed.items()}
        ),
        "static_cost_fraction": _interval(
            {s: r["static"]["test"]["cost_fraction"] for s, r in routed.items()}
        ),
        "routed_over_dense_time": _interval(
            {s: r["timing"]["routed_over_dense"] for s, r in routed.items()}
        ),
        "verdict": verdict.verdict_fields(),
        "sentence": comparison_sentence(verdict).text,
    }


def _blocked(
    name: str, flags: Sequence[str], other: str = "", other_flags: Sequence[str] = ()
) -> str | None:
    parts = [
        f"{who} excluded ({', '.join(sorted({f for f in fl if f in EXCLUDING_FLAGS}))})"
        for who, fl in ((name, flags), (other, other_flags))
        if any(f in EXCLUDING_FLAGS for f in fl)
    ]
    return "; ".join(parts) or None


def _reference_arm(arms: Sequence[str]) -> str | None:
    """The arm damage differences are taken against: ``residual`` if present, else the first."""
    if not arms:
        return None
    return "residual" if "residual" in arms else sorted(arms)[0]


def _damage_at(size: str) -> _Getter:
    """Test damage averaged over the masks keeping ``size`` branches."""
    return lambda r: r["by_size"][size]["test"]["damage"]


def paired_damage(arms: Mapping[str, Mapping[int, Mapping[str, Any]]], which: str) -> list[dict]:
    """``damage(arm) - damage(reference)`` paired by seed, for every mask size, judged as one
    family (every comparison of this checkpoint)."""
    ref = _reference_arm(list(arms))
    if ref is None:
        return []
    ref_arm = arms[ref]
    items, meta = [], []
    for name, arm in sorted(arms.items()):
        k = next(iter(arm.values()))["k"]
        if name == ref or k != next(iter(ref_arm.values()))["k"]:
            continue
        for size in next(iter(arm.values()))["by_size"]:
            if size == str(k):
                continue
            q = cross_entropy(f"test damage ΔCE, mean over masks keeping {size} of {k}")
            blocked = _blocked(name, _arm_flags(arm, which), ref, _arm_flags(ref_arm, which))
            a, b = _by_seed(arm, _damage_at(size)), _by_seed(ref_arm, _damage_at(size))
            items.append(paired(f"{name}/{size}", q, a, b, names=(name, ref), blocked=blocked))
            meta.append(
                {"arm": name, "reference": ref, "kept": size, "seeds": sorted(set(a) & set(b))}
            )
    return [
        {**m, "verdict": c.verdict_fields(), "sentence": comparison_sentence(c).text}
        for m, c in zip(meta, judge(f"paired damage ({which})", items))
    ]


def damage_loss(arms: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> dict[str, Any] | None:
    """The loss the arms' damage is measured in (a record's ``loss``: the run's ``[loss]``),
    ``None`` for plain cross-entropy (nats); refused when the runs' losses differ (their
    damages are not one quantity)."""
    seen = {
        json.dumps(rec.get("loss"), sort_keys=True) for arm in arms.values() for rec in arm.values()
    }
    if len(seen) > 1:
        raise FathomError(
            "the audited runs were trained with different losses ([loss] tables), so their "
            "damages are not one quantity: audit them apart"
        )
    return json.loads(seen.pop()) if seen else None


def aggregate(runs: Sequence[Mapping[str, Any]], checkpoints: Sequence[str]) -> dict[str, Any]:
    """Per checkpoint kind: every arm's summary and the paired damage comparisons. Damage
    in a loss other than cross-entropy (``mse``, ``bce_with_logits``: no smallest effect of
    interest is defined for it, docs/statistics.md) is summarised but not judged
    (``paired_damage_not_judged`` says why)."""
    out: dict[str, Any] = {}
    for which in checkpoints:
        arms = _group_arms(runs, which)
        loss = damage_loss(arms)
        out[which] = {
            "arms": {name: _arm_summary(arm, which) for name, arm in sorted(arms.items())},
            "reference_arm": _reference_arm(list(arms)),
        }
        if loss is not None:
            out[which]["damage_loss"] = loss
        if loss is not None and loss["name"] != "cross_entropy":
            out[which]["paired_damage"] = []
            out[which]["paired_damage_not_judged"] = (
                f"damage is the change of the runs' loss, {loss['name']}, for which no "
                "smallest effect of interest is defined (docs/statistics.md: cross-entropy in "
                "nats, accuracy in pp); the intervals above are descriptive"
            )
        else:
            out[which]["paired_damage"] = paired_damage(arms, which)
    return out
