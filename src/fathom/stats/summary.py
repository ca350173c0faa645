"""Study summary: per-recipe tables, paired differences against a reference, time to a
target, fixed-horizon training time, failure flags, verdicts and rankings.

Input is plain data (:class:`RunRecord`, one per main-phase run); :mod:`fathom.study`
builds the records from run directories. Output is a JSON-able dict
(:func:`summarise_study`); its markdown rendering is :func:`fathom.stats.summary_md.to_markdown`.

Definitions (all over seeds of one recipe, sample SD with ddof = 1):

* selected checkpoint: minimum validation CE; final checkpoint: last epoch.
* comparisons: ``recipe(s) - reference(s)`` paired over seeds, judged by
  :mod:`fathom.stats.inference` (resolution floor, smallest effect of interest, Holm over
  the family of every comparison of the summary, leave-one-seed-out); the typed model is
  ``summary["results"]`` (:class:`fathom.stats.results.Results`), its ``tables`` every table
  of the summary (:mod:`fathom.stats.summary_tables`), which every renderer prints.
* time to target: first evaluated time with validation accuracy >= target, on the
  training clock and on elapsed time; precision is bounded by the evaluation cadence.
* rankings: per metric, the recipes' means at both checkpoints side by side and every pair
  of recipes compared paired over seeds at both (:mod:`fathom.stats.ranking`: one Holm
  family per metric, and the statement whether the ranking differs between checkpoints).
* fixed-horizon training time: training clock for the whole configured budget (every
  run trains the same epochs, enforced by the config fingerprint); ratio of means to
  the reference and the paired per-seed ratio with its t interval.
* Accuracy is stored as a fraction (records, JSON) and rendered in percent through
  :func:`fathom.base.units.percent`; differences in percentage points.
* A recipe with any excluded run (diverged, at or near chance, incomplete) takes part in
  no comparison and is listed; its table rows use only its non-excluded runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fathom.base.units import fmt_percent
from fathom.errors import FathomError
from fathom.stats.flags import failure_flags, is_excluded
from fathom.stats.inference import judge
from fathom.stats.intervals import mean_sd, t_interval
from fathom.stats.quantities import fraction_problem
from fathom.stats.ranking import rankings
from fathom.stats.results import Comparison, Results
from fathom.stats.rules import DEFAULT_RULES, Rules
from fathom.stats.sentences import comparison_sentence, family_note
from fathom.stats.summary_compare import (
    CHECKPOINTS,
    COMPARED_METRICS,
    FAMILY,
    paired_items,
    row,
)
from fathom.stats.summary_tables import summary_tables
from fathom.stats.verdicts import first_crossing

_CHECKPOINT_KEYS = ("test_acc", "test_ce", "val_ce", "epoch")


@dataclass(frozen=True)
class RunRecord:
    """One run of a study, reduced to the numbers the summary needs.

    ``selected`` / ``final``: ``{"test_acc", "test_ce", "val_ce", "epoch"}`` (``None`` where
    undefined). ``curve``: ``(epoch, training_s, elapsed_s, val_acc)`` per evaluated
    epoch. ``config_fingerprint``: the config fields that must match across compared
    runs (dataset, epochs, batch, widths, ...). ``fit_ce_final`` is the fitting-set CE at
    the end, used for the "CE near ln C" flag.
    """

    recipe: str
    seed: int
    lr: float | None
    status: str
    classes: int
    selected: Mapping[str, float | int | None]
    final: Mapping[str, float | int | None]
    fit_acc_final: float | None
    training_clock_s: float | None
    elapsed_s: float | None
    curve: Sequence[tuple[int, float, float, float | None]]
    config_fingerprint: Mapping[str, Any] = field(default_factory=dict)
    fit_ce_final: float | None = None
    n_test: int | None = None

    def flags(self) -> list[str]:
        """Failure flags from final values (:func:`fathom.stats.flags.failure_flags`);
        ``n_test`` is the test-set size the accuracies are measured on."""
        return failure_flags(
            status=self.status,
            test_acc=self.final.get("test_acc"),
            train_ce=self.fit_ce_final,
            classes=self.classes,
            n_eval=self.n_test,
            fit_acc=self.fit_acc_final,
        )


def _check_records(records: Sequence[RunRecord], reference: str) -> dict[str, list[RunRecord]]:
    if not records:
        raise FathomError("no run records to summarise; run the study's main phase first")
    by_recipe: dict[str, list[RunRecord]] = {}
    for r in records:
        by_recipe.setdefault(r.recipe, []).append(r)
    if reference not in by_recipe:
        raise FathomError(
            f"reference recipe {reference!r} is not in the records; recipes present: "
            f"{sorted(by_recipe)}. Choose one of them as the reference"
        )
    seen: set[tuple[str, int]] = set()
    for r in records:
        if (r.recipe, r.seed) in seen:
            raise FathomError(
                f"two records for recipe {r.recipe!r} seed {r.seed}; keep one run per "
                "(recipe, seed) in a comparison"
            )
        seen.add((r.recipe, r.seed))
        for where in CHECKPOINTS:
            missing = [k for k in _CHECKPOINT_KEYS if k not in getattr(r, where)]
            if missing:
                raise FathomError(
                    f"record {r.recipe!r} seed {r.seed}: {where} lacks {missing}; give every "
                    f"key of {_CHECKPOINT_KEYS} (None when undefined)"
                )
    accs = [getattr(r, w).get("test_acc") for r in records for w in CHECKPOINTS]
    why = fraction_problem([*accs, *(r.fit_acc_final for r in records)])
    if why is not None:
        raise FathomError(f"the run records' {why}")
    first = records[0]
    for r in records[1:]:
        keys = sorted(set(first.config_fingerprint) | set(r.config_fingerprint))
        for k in keys:
            va, vb = first.config_fingerprint.get(k), r.config_fingerprint.get(k)
            if va != vb:
                raise FathomError(
                    f"runs with different configs in one comparison: field {k!r} is {va!r} "
                    f"for {first.recipe!r} seed {first.seed} but {vb!r} for {r.recipe!r} seed "
                    f"{r.seed}; compare only runs of the same study config"
                )
    return by_recipe


def _stat(values: Sequence[float | None]) -> dict[str, Any]:
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    mean, sd, n = mean_sd(xs)
    return {"mean": mean, "sd": sd, "n": n}


def _cadence(curve: Sequence[tuple[int, float, float, float | None]]) -> int | None:
    epochs = [e for e, _, _, v in curve if v is not None]
    gaps = [b - a for a, b in itertools.pairwise(epochs)]
    return max(gaps) if gaps else None


def summarise_study(
    records: Sequence[RunRecord],
    *,
    reference: str,
    target_val_acc: float | None = None,
    level: float | None = None,
    rules: Rules = DEFAULT_RULES,
) -> dict[str, Any]:
    """JSON-able summary of a study's main-phase runs against ``reference``
    (``level``, when given, overrides ``rules.level``).

    Refuses empty records, a reference missing from them, duplicate (recipe, seed)
    pairs and records whose ``config_fingerprint`` differ (naming the field).
    """
    by_recipe = _check_records(records, reference)
    if level is not None:
        rules = rules.model_copy(update={"level": level})
    level = rules.level
    names = [reference, *sorted(n for n in by_recipe if n != reference)]
    flags = {n: {r.seed: r.flags() for r in by_recipe[n]} for n in names}
    excluded_recipe = {n: any(is_excluded(f) for f in flags[n].values()) for n in names}
    usable = {n: [r for r in by_recipe[n] if not is_excluded(flags[n][r.seed])] for n in names}
    ref_train = {r.seed: clock for r in usable[reference] if (clock := r.training_clock_s)}
    recipes = {
        n: _recipe_entry(by_recipe[n], usable[n], flags[n], excluded_recipe[n], ref_train,
                         target_val_acc, level)
        for n in names
    }  # fmt: skip
    cadences = [c for n in names for c in (_cadence(r.curve) for r in usable[n]) if c is not None]
    comparisons = judge(FAMILY, paired_items(names, reference, usable, flags), rules)
    sentences = [comparison_sentence(c) for c in comparisons]
    notes = _notes(comparisons, level, target_val_acc, cadences)
    ranked = [n for n in names if not excluded_recipe[n]]
    main = {(c.a, c.b, f"{c.context['checkpoint']}/{c.context['metric']}"): c for c in comparisons}
    ranks, pairwise, rank_sentences, decisions = rankings(recipes, ranked, usable, rules, main)
    out = {
        "reference": reference,
        "level": level,
        "target_val_acc": target_val_acc,
        "n_runs": len(records),
        "config": dict(records[0].config_fingerprint),
        "recipes": recipes,
        "comparisons": [row(c, s.text) for c, s in zip(comparisons, sentences)],
        "rankings": ranks,
        "excluded": [
            {"recipe": n, "seed": s, "flags": f}
            for n in names
            for s, f in sorted(flags[n].items())
            if is_excluded(f)
        ],
        "notes": notes,
    }
    results = Results(
        comparisons=[*comparisons, *pairwise],
        sentences=[*sentences, *rank_sentences],
        decisions=decisions,
        caveats=notes,
        tables=summary_tables(out),
    )
    return {**out, "results": results.model_dump(mode="json")}


def _recipe_entry(
    runs_all: Sequence[RunRecord],
    runs: Sequence[RunRecord],
    flags: Mapping[int, list[str]],
    excluded: bool,
    ref_train: Mapping[int, float],
    target_val_acc: float | None,
    level: float,
) -> dict[str, Any]:
    """One recipe's row: seeds, LRs, flags, checkpoint stats over its usable ``runs``,
    fixed-horizon training time (and its ratio to the reference), time to target."""
    entry: dict[str, Any] = {
        "seeds": sorted(r.seed for r in runs_all),
        "lr": sorted({r.lr for r in runs_all if r.lr is not None}),
        "flags": {str(s): f for s, f in sorted(flags.items())},
        "excluded": excluded,
    }
    for where in CHECKPOINTS:
        entry[where] = {
            key: _stat([getattr(r, where)[key] for r in runs]) for key, _, _ in COMPARED_METRICS
        }
    train = {r.seed: clock for r in runs if (clock := r.training_clock_s) is not None}
    entry["training_s"] = _stat(list(train.values()))
    ref_mean = _stat(list(ref_train.values()))["mean"]
    own_mean = entry["training_s"]["mean"]
    entry["training_ratio_to_reference"] = {
        "ratio_of_means": None
        if ref_mean in (None, 0.0) or own_mean is None
        else own_mean / ref_mean,
        "paired_ratio": _paired_ratio(train, ref_train, level),
    }
    if target_val_acc is not None:
        entry["time_to_target"] = _time_to_target(runs, target_val_acc)
    return entry


def _notes(
    comparisons: Sequence[Comparison],
    level: float,
    target_val_acc: float | None,
    cadences: Sequence[int],
) -> list[str]:
    notes = [
        family_note(comparisons, level),
        "An interval is never narrower than the measurement's resolution (accuracy: the "
        "binomial bound on the test set; CE: 0.0001 nats); better/worse needs it outside the "
        "region of no interest, equivalent inside it (docs/statistics.md).",
        "A recipe with a diverged, at-chance, near-chance or incomplete run takes part in no "
        "comparison.",
    ]
    if target_val_acc is not None:
        step = max(cadences) if cadences else None
        notes.append(
            f"Time to validation accuracy >= {fmt_percent(target_val_acc)} is the first "
            "evaluated time; "
            f"evaluation every {step} epoch(s) bounds its precision (it can be late by up to "
            "one evaluation interval)."
        )
    return notes


def _paired_ratio(
    own: Mapping[int, float], ref: Mapping[int, float], level: float
) -> dict[str, Any] | None:
    common = sorted(s for s in set(own) & set(ref) if ref[s] > 0)
    if not common:
        return None
    return t_interval([own[s] / ref[s] for s in common], level).to_dict()


def _time_to_target(runs: Sequence[RunRecord], target: float) -> dict[str, Any]:
    train_t: dict[str, float | None] = {}
    elapsed_t: dict[str, float | None] = {}
    for r in runs:
        vals = [v for _, _, _, v in r.curve]
        train_t[str(r.seed)] = first_crossing([t for _, t, _, _ in r.curve], vals, target)
        elapsed_t[str(r.seed)] = first_crossing([t for _, _, t, _ in r.curve], vals, target)
    reached = sum(t is not None for t in train_t.values())
    return {
        "reached": reached,
        "n": len(runs),
        "training_s": {**_stat(list(train_t.values())), "per_seed": train_t},
        "elapsed_s": {**_stat(list(elapsed_t.values())), "per_seed": elapsed_t},
        "scope": "mean over the seeds that reached the target",
    }
