"""Run directories -> the plain records the registry and :mod:`fathom.stats` take."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fathom.base.units import fmt_percent
from fathom.rundir import RunDir
from fathom.stats.flags import failure_flags
from fathom.study.plan import RunSpec

if (
    TYPE_CHECKING
):  # fathom.stats.summary imports scipy.special (~0.3 s): only where a record is made
    from fathom.stats import RunRecord

_PER_RUN_KEYS: tuple[str, ...] = ("name", "seed", "model.recipe", "optim.lr")
"""Config keys that differ between the runs of one comparison by design."""


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = tuple(v) if isinstance(v, list) else v
    return out


def _config_fingerprint(config: dict[str, Any]) -> dict[str, Any]:
    """Every config field except the per-run ones (:data:`_PER_RUN_KEYS`), flattened."""
    return {k: v for k, v in _flatten(config).items() if k not in _PER_RUN_KEYS}


def _row_at(rows: list[dict[str, Any]], epoch: int | None) -> dict[str, Any]:
    if epoch is None:
        return {}
    for r in rows:
        if r.get("epoch") == epoch and "val/ce" in r:
            return r
    return {}


def _finite(x: Any) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def checkpoint_scores(rd: RunDir) -> dict[str, dict[str, Any]]:
    """``{"selected": {...}, "final": {...}}`` with ``test_acc``, ``test_ce``, ``val_ce``,
    ``val_acc``, ``fit_acc``, ``fit_ce``, ``epoch`` from the history rows at those epochs."""
    rows = rd.history()
    sel_epoch = rd.record.selected.epoch
    fin_epoch = rd.record.final.epoch if rd.status == "complete" else None
    out = {}
    for where, epoch in (("selected", sel_epoch), ("final", fin_epoch)):
        row = _row_at(rows, epoch)
        out[where] = {
            "epoch": epoch if row else None,
            **{
                key.replace("/", "_"): _finite(row.get(key))
                for key in ("test/acc", "test/ce", "val/ce", "val/acc", "fit/acc", "fit/ce")
            },
        }
    return out


def outcome_warnings(rd: RunDir) -> list[str]:
    """What a complete run's result warns of, by :func:`fathom.stats.failure_flags` on its
    final epoch (test accuracy on the recorded test-set size, fitting CE and accuracy): at
    chance, near chance (undetermined), or not fitting."""
    if rd.status != "complete":
        return []
    final = checkpoint_scores(rd)["final"]
    baseline = rd.recorded.data.info.unigram_val_ce
    if baseline is not None:  # a language model: judged against its unigram baseline
        return language_model_warnings(final["val_ce"], baseline)
    classes = rd.classes
    if classes < 2:
        return []  # one class: chance is not defined, nothing to judge
    flags = failure_flags(
        status="complete",
        test_acc=final["test_acc"],
        train_ce=final["fit_ce"],
        classes=classes,
        n_eval=rd.record.data.sizes.test,
        fit_acc=final["fit_acc"],
    )
    acc = "unknown" if final["test_acc"] is None else fmt_percent(final["test_acc"], 1)
    out = []
    if "at_chance" in flags:
        out.append(
            f"the run ended at chance: test accuracy {acc} with {classes} classes (chance "
            f"{fmt_percent(1 / classes, 1)}); it learned nothing usable. Check the labels, the learning "
            "rate (optim.lr) and the budget (optim.epochs)"
        )
    if "near_chance" in flags:
        out.append(
            f"the run ended near chance: test accuracy {acc} with {classes} classes (chance "
            f"{fmt_percent(1 / classes, 1)}) is statistically neither at chance nor clearly above it"
        )
    if "not_fitting" in flags:
        fit = fmt_percent(final["fit_acc"], 1)
        out.append(f"the run does not fit its training set (fitting accuracy {fit} at the end)")
    return out


def language_model_warnings(val_ce: float | None, baseline: float) -> list[str]:
    """A language-model run whose final validation CE is not below the unigram baseline's
    (``data.info.unigram_val_ce``) learned nothing of context: said, with both perplexities."""
    if val_ce is not None and val_ce < baseline:
        return []
    got = "unknown" if val_ce is None else f"{math.exp(val_ce):.2f}"
    return [
        f"the run's validation perplexity {got} is not below the unigram baseline's "
        f"{math.exp(baseline):.2f} (byte frequencies alone): it learned nothing of context. "
        "Check the learning rate (optim.lr) and the budget (optim.epochs)"
    ]


def run_record(rd: RunDir, recipe: str, seed: int, lr: float) -> RunRecord:
    """A :class:`fathom.stats.RunRecord` of one run directory."""
    from fathom.stats import RunRecord

    scores = checkpoint_scores(rd)
    keys = ("test_acc", "test_ce", "val_ce", "epoch")
    clocks = rd.record.clocks
    curve = [
        (
            int(r["epoch"]),
            float(r["clock/training_s"]),
            float(r["clock/elapsed_s"]),
            _finite(r.get("val/acc")),
        )
        for r in rd.history()
        if "clock/training_s" in r and "val/acc" in r
    ]
    complete = rd.status == "complete"
    return RunRecord(
        recipe=recipe,
        seed=seed,
        lr=lr,
        status=rd.status
        if rd.status in ("complete", "diverged", "failed", "running", "interrupted")
        else "failed",
        classes=rd.classes,
        selected={k: scores["selected"][k] for k in keys},
        final={k: scores["final"][k] for k in keys},
        fit_acc_final=scores["final"]["fit_acc"],
        training_clock_s=clocks.training_s if complete else None,
        elapsed_s=clocks.elapsed_s if complete else None,
        curve=curve,
        config_fingerprint=_config_fingerprint(rd.record.config),
        fit_ce_final=scores["final"]["fit_ce"],
        n_test=rd.record.data.sizes.test,
    )


_TRAIN_PHASE = "train"
"""The registry's ``phase`` of a run no study planned (a run of ``fathom train``)."""


def run_row(run_dir: str | Path) -> dict[str, Any]:
    """The registry row of any run directory, its identity read from its manifest: the
    manifest's ``phase`` (:data:`_TRAIN_PHASE` where it records none), the model's recipe
    (its ``kind`` where it has none), the config's ``seed`` and ``optim.lr``. A study's run
    gets the row its study gives it (same run id, study, phase, recipe, seed and rate)."""
    rd = RunDir(run_dir)
    config = rd.recorded.config
    spec = RunSpec(
        run_id=rd.run_id,
        study=rd.header.study or Path(run_dir).resolve().parent.name,
        phase=rd.phase or _TRAIN_PHASE,
        recipe=config.model.recipe or config.model.kind or "—",
        seed=config.seed or 0,
        lr=config.optim.lr or 0.0,
        run_dir=str(run_dir),
        config=rd.header.config,
    )
    return registry_row(spec)


def registry_row(spec: RunSpec) -> dict[str, Any]:
    """The registry row of ``spec``'s run directory (its current state)."""
    path = Path(spec.run_dir)
    row: dict[str, Any] = {
        "run_id": spec.run_id,
        "study": spec.study,
        "phase": spec.phase,
        "recipe": spec.recipe,
        "seed": spec.seed,
        "lr": spec.lr,
        "directory": str(path.resolve()),  # the registry stores it relative to its folder
    }
    if not (path / "manifest.json").exists():
        return {
            **row,
            "status": "absent",
            "status_reason": None,
            "config_hash": None,
            **dict.fromkeys(
                (
                    "epochs_completed",
                    "diverged_epoch",
                    "selected_epoch",
                    "selected_val_ce",
                    "selected_test_acc",
                    "selected_test_ce",
                    "final_epoch",
                    "final_val_ce",
                    "final_test_acc",
                    "final_test_ce",
                    "final_params",
                    "training_s",
                    "elapsed_s",
                )
            ),
        }
    rd = RunDir(path)
    m = rd.record
    scores = checkpoint_scores(rd)
    return {
        **row,
        "status": rd.status,
        "status_reason": m.status_reason,
        "config_hash": m.config_hash,
        "epochs_completed": m.epochs_completed,
        "diverged_epoch": m.diverged_epoch,
        "selected_epoch": scores["selected"]["epoch"],
        "selected_val_ce": scores["selected"]["val_ce"],
        "selected_test_acc": scores["selected"]["test_acc"],
        "selected_test_ce": scores["selected"]["test_ce"],
        "final_epoch": scores["final"]["epoch"],
        "final_val_ce": scores["final"]["val_ce"],
        "final_test_acc": scores["final"]["test_acc"],
        "final_test_ce": scores["final"]["test_ce"],
        "final_params": m.hashes.final_params,
        "training_s": m.clocks.training_s,
        "elapsed_s": m.clocks.elapsed_s,
    }
