"""The results table, read from run directories, and its computed verdict.

Per run (from ``manifest.json`` and ``history.jsonl`` only):

* ``test_acc``: test accuracy at the selected epoch (minimum validation CE; the test set is
  never used to choose); ``fit_ce``: fitting-set CE (dense) at that epoch. These two feed
  the failure flags and the verdict (:func:`fathom.stats.depth_scaling_verdict`); a run
  that never completed an epoch has ``None``.
* ``lyapunov``: λ̂ on the probe examples at the last health check; ``grad_norm``: the mean
  total gradient norm over the steps of the last completed epoch; ``kappa``: median κ of
  the float64 input-output Jacobian at the last health check (over numerically nonzero
  singular values; see :mod:`fathom.dynamics.health`).

Table cells are means over seeds (``n`` shown when more than one seed). Ill-conditioning
notes are printed only from κ computed that way.

Two views: ``table.md`` (:func:`write_table`, the log's columns plus κ and failures) and,
for an 80-column terminal, :func:`print_results`: two tables instead of the log's eleven
columns (accuracy per depth with each arm's cell state, trained / failed / partial, and the
difference; then gradient health), the failures, the two computed answers (level across
depths, scaling with depth), the sentence they rest on and the conditioning notes as wrapped
lines. Accuracy is in percent, its difference in percentage points.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from fathom.base.io import atomic_write_json, atomic_write_text
from fathom.base.terminal import table as terminal_table
from fathom.base.units import fmt_value, percent
from fathom.dynamics.health import ILL_CONDITIONED_KAPPA, RANK_FLOOR_RULE
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.stats.flags import failure_flags
from fathom.stats.scaling import depth_scaling_verdict
from fathom.stats.scaling_table import ArmRuns, DepthScalingTable, DepthScalingVerdict

BASELINE, CANDIDATE = "vanilla", "Lyapunov"


@dataclass(frozen=True)
class RunRecord:
    """One run's row inputs; ``None`` where not recorded."""

    depth: int
    arm: str
    seed: int
    status: str
    test_acc: float | None
    fit_ce: float | None
    fit_acc: float | None = None
    lyapunov: float | None = None
    grad_norm: float | None = None
    kappa: float | None = None
    silent_layers: list[str] | None = None
    selected_epoch: int | None = None
    run_dir: str | None = None
    flags: list[str] = field(default_factory=list)
    n_test: int | None = None


def _last(history: list[dict[str, Any]], key: str) -> Any:
    for row in reversed(history):
        if row.get(key) is not None:
            return row[key]
    return None


def read_run(path: Path) -> RunRecord:
    """A :class:`RunRecord` from one run directory (through the run-directory reader)."""
    rd = RunDir(path)
    if rd.kind == "depth_scaling":
        raise FathomError(
            f"{str(path)!r} was written by the depth-scaling runner of manifest format "
            f"{rd.header.format} (kind 'depth_scaling'), before it wrote run "
            "directories; its rows cannot be verified. Rerun `fathom depth-scaling` to rebuild it"
        )
    if rd.kind != "run" or rd.config.tags.get("benchmark") != "depth_scaling":
        raise FathomError(
            f"{str(path)!r} is not a depth-scaling run (no depth/arm tags); "
            "pass the benchmark's output directory"
        )
    cfg, history = rd.config, rd.history()
    recorded = rd.recorded  # format 2 runs too: selected and sizes read as written
    observed = [r for r in history if r.get("epoch", 0) >= 1 and "val/acc" in r]
    sel_epoch = recorded.selected.epoch
    sel = next((r for r in observed if r["epoch"] == sel_epoch), None)
    return RunRecord(
        depth=int(cfg.tags["depth"]),
        arm=str(cfg.tags["arm"]),
        seed=int(cfg.seed),
        status=rd.status,
        test_acc=None if sel is None else sel.get("test/acc"),
        fit_ce=None if sel is None else sel.get("fit/ce"),
        fit_acc=None if sel is None else sel.get("fit/acc"),
        lyapunov=_last(observed, "lyap/maximal"),
        grad_norm=_last(history, "grad_norm/total"),
        kappa=_last(observed, "jac/kappa"),
        silent_layers=_last(observed, "spike/silent_layers"),
        selected_epoch=sel_epoch,
        run_dir=str(path),
        n_test=(recorded.data.sizes or {}).get("test"),
    )


def read_runs(root: Path) -> list[RunRecord]:
    """Every run directory directly under ``root``, each checked by
    :meth:`fathom.rundir.RunDir.problems` first: a run whose manifest is unverified or whose
    history is missing, torn, cut short or modified is refused (all of them named), never
    read into the table and its verdict."""
    dirs = sorted(p for p in Path(root).iterdir() if (p / "manifest.json").exists())
    if not dirs:
        raise FathomError(
            f"no run directories under {str(root)!r}; run `fathom depth-scaling` first"
        )
    damaged = {p.name: RunDir(p).problems() for p in dirs}
    damaged = {name: problems for name, problems in damaged.items() if problems}
    if damaged:
        listed = "; ".join(f"{name}: {', '.join(problems)}" for name, problems in damaged.items())
        raise FathomError(
            f"{len(damaged)} run(s) under {str(root)!r} fail their integrity checks, so the "
            f"table and its verdict are not computed ({listed}). Rerun the same "
            "`fathom depth-scaling` command with --out on this directory: it retrains a "
            "damaged run (training is deterministic; the final hash is checked)"
        )
    return [read_run(p) for p in dirs]


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite and len(finite) == len(values) else None


def verdict_table(records: list[RunRecord], classes: int, dataset: str = "") -> DepthScalingTable:
    """The statistics module's input: per depth and arm, per-seed test accuracy, CE, status."""
    rows: dict[int, dict[str, ArmRuns]] = {}
    for depth in sorted({r.depth for r in records}):
        rows[depth] = {}
        for arm in (BASELINE, CANDIDATE):
            runs = sorted(
                (r for r in records if r.depth == depth and r.arm == arm), key=lambda r: r.seed
            )
            rows[depth][arm] = ArmRuns(
                test_acc=[r.test_acc for r in runs],
                status=[r.status for r in runs],
                train_ce=[r.fit_ce for r in runs],
                seeds=[r.seed for r in runs],
            )
    sizes = {r.n_test for r in records}
    return DepthScalingTable(
        classes=classes,
        baseline=BASELINE,
        candidate=CANDIDATE,
        rows=rows,
        dataset=dataset,
        n_eval=sizes.pop() if len(sizes) == 1 else None,
    )


@dataclass
class ResultsTable:
    dataset: str
    classes: int
    rows: list[dict[str, Any]]
    verdict: DepthScalingVerdict
    conditioning: list[str]
    records: list[RunRecord]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "classes": self.classes,
            "rows": self.rows,
            "verdict": self.verdict.to_dict(),
            "conditioning": self.conditioning,
            "kappa_rule": f"median over probes; numerically nonzero: {RANK_FLOOR_RULE}",
            "runs": [asdict(r) for r in self.records],
        }


def build_table(records: list[RunRecord], classes: int, dataset: str = "") -> ResultsTable:
    """Rows with the log's columns plus failures, and the computed verdict."""
    verdict = depth_scaling_verdict(verdict_table(records, classes, dataset))
    flagged = []
    for r in records:
        flags = failure_flags(
            status=r.status,
            test_acc=r.test_acc,
            train_ce=r.fit_ce,
            classes=classes,
            n_eval=r.n_test,
            fit_acc=r.fit_acc,
        )
        flagged.append(RunRecord(**{**asdict(r), "flags": flags}))
    rows, conditioning = [], []
    for depth in sorted({r.depth for r in flagged}):
        cell = {
            arm: [r for r in flagged if r.depth == depth and r.arm == arm]
            for arm in (BASELINE, CANDIDATE)
        }
        base_acc = _mean([r.test_acc for r in cell[BASELINE]])
        cand_acc = _mean([r.test_acc for r in cell[CANDIDATE]])
        failures = [
            f"{r.arm} s{r.seed}: {', '.join(r.flags)}"
            for arm in (BASELINE, CANDIDATE)
            for r in cell[arm]
            if r.flags
        ]
        row = {
            "depth": depth,
            "seeds": len(cell[BASELINE]),
            "vanilla_acc": base_acc,
            "lyapunov_acc": cand_acc,
            "delta_acc": None if base_acc is None or cand_acc is None else cand_acc - base_acc,
            "vanilla_lambda": _mean([r.lyapunov for r in cell[BASELINE]]),
            "lyapunov_lambda": _mean([r.lyapunov for r in cell[CANDIDATE]]),
            "vanilla_grad_norm": _mean([r.grad_norm for r in cell[BASELINE]]),
            "lyapunov_grad_norm": _mean([r.grad_norm for r in cell[CANDIDATE]]),
            "vanilla_kappa": _median([r.kappa for r in cell[BASELINE]]),
            "lyapunov_kappa": _median([r.kappa for r in cell[CANDIDATE]]),
            "cells": verdict.cells.get(depth, {}),
            "failures": failures,
        }
        rows.append(row)
        for arm, key in ((BASELINE, "vanilla_kappa"), (CANDIDATE, "lyapunov_kappa")):
            if row[key] is not None and row[key] > ILL_CONDITIONED_KAPPA:
                conditioning.append(
                    f"depth {depth}: {arm} input-output Jacobian is ill-conditioned "
                    f"(median κ = {row[key]:.2e} > {ILL_CONDITIONED_KAPPA:.0e}, float64, "
                    "over numerically nonzero singular values)"
                )
    return ResultsTable(dataset, classes, rows, verdict, conditioning, flagged)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _pct(fraction: float | None, unit: str = "%") -> str:
    """An accuracy (``%``) or a difference of accuracies (``pp``), the header stating the unit."""
    return fmt_value(percent(fraction), unit, signed=unit == "pp", suffix=False)


def _f(v: float | None, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def render_markdown(table: ResultsTable, note: str = "") -> str:
    """``table.md``: the columns of the original log plus κ of both arms and failures."""
    lines = [f"# Depth scaling: {table.dataset} ({table.classes} classes)", ""]
    if note:
        lines += [note, ""]
    lines += [
        "| depth | vanilla acc (%) | Lyapunov acc (%) | Δ acc (pp) | vanilla λ̂ | Lyapunov λ̂ | vanilla ∇norm | "
        "Lyapunov ∇norm | vanilla κ | Lyapunov κ | failures |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in table.rows:
        lines.append(
            f"| {r['depth']} | {_pct(r['vanilla_acc'])} | "
            f"{_pct(r['lyapunov_acc'])} | {_pct(r['delta_acc'], 'pp')} | "
            f"{_f(r['vanilla_lambda'], '.3f')} | "
            f"{_f(r['lyapunov_lambda'], '.3f')} | {_f(r['vanilla_grad_norm'], '.2e')} | "
            f"{_f(r['lyapunov_grad_norm'], '.2e')} | {_f(r['vanilla_kappa'], '.1e')} | "
            f"{_f(r['lyapunov_kappa'], '.1e')} | {'; '.join(r['failures']) or '—'} |"
        )
    lines += ["", *_verdict_markdown(table.verdict), ""]
    lines += [f"- {o}" for o in table.verdict.observations]
    if table.conditioning:
        lines += ["", "Conditioning:", *[f"- {c}" for c in table.conditioning]]
    lines += [
        "",
        "Accuracy: test accuracy (%, differences in percentage points) at the epoch of minimum "
        "validation CE (mean over seeds). "
        "λ̂: maximal depth-wise Lyapunov exponent on probe examples at the last health check. "
        "∇norm: mean total gradient norm over the last epoch's steps. κ: median over probe "
        "examples of σ_max/σ_min of the float64 input-output Jacobian, σ_min the smallest "
        f"numerically nonzero singular value ({RANK_FLOOR_RULE}). A run FAILED when it "
        "diverged or its test accuracy is statistically indistinguishable from chance (exact "
        "binomial interval on the test set), is UNDETERMINED near that boundary and then "
        "decides nothing (docs/statistics.md).",
        "",
    ]
    return "\n".join(lines)


def _verdict_markdown(v: DepthScalingVerdict) -> list[str]:
    """The two answers, each on its own line, then every sentence they rest on."""
    head = [line.split(": ", 1) for line in v.answer_lines(CANDIDATE, BASELINE)]
    body = [f"- {line}" for line in v.lines] or [v.sentence]
    answers = [x for q, a in head for x in (f"**{q}:** {a}.", "")]
    return [*answers, "**Verdict:**", "", *body]


def run_classes(root: Path) -> tuple[int, str]:
    """``(classes, dataset)`` recorded by the benchmark's runs (they must agree)."""
    seen = {
        (rd.classes, rd.config.data.dataset)
        for rd in (
            RunDir(p) for p in sorted(Path(root).iterdir()) if (p / "manifest.json").exists()
        )
    }
    if len(seen) != 1:
        raise FathomError(
            f"the runs under {str(root)!r} record {len(seen)} different datasets / class counts "
            f"{sorted(seen)}; a benchmark's runs share one dataset"
        )
    return seen.pop()


def write_table(root: Path, note: str = "") -> ResultsTable:
    """Read the run directories under ``root``; write ``table.md`` and ``table.json``."""
    classes, dataset = run_classes(root)
    table = build_table(read_runs(root), classes, dataset)
    atomic_write_text(root / "table.md", render_markdown(table, note))
    atomic_write_json(root / "table.json", table.to_dict())
    return table


def _cell(v: float | None, spec: str, scale: float = 1.0) -> str:
    return "—" if v is None else format(scale * v, spec)


def _accuracy_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        cells = r["cells"]
        out.append(
            [
                str(r["depth"]),
                str(r["seeds"]),
                _cell(r["vanilla_acc"], ".2f", 100),
                cells.get(BASELINE, "—"),
                _cell(r["lyapunov_acc"], ".2f", 100),
                cells.get(CANDIDATE, "—"),
                _cell(r["delta_acc"], "+.2f", 100),
            ]
        )
    return out


def _health_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            str(r["depth"]),
            _cell(r["vanilla_lambda"], ".3f"),
            _cell(r["lyapunov_lambda"], ".3f"),
            _cell(r["vanilla_grad_norm"], ".2e"),
            _cell(r["lyapunov_grad_norm"], ".2e"),
            _cell(r["vanilla_kappa"], ".1e"),
            _cell(r["lyapunov_kappa"], ".1e"),
        ]
        for r in rows
    ]


def print_results(results: ResultsTable, note: str = "", console: Console | None = None) -> None:
    """Accuracy and health tables, failures, the verdict, conditioning notes."""
    console = console or Console()
    title = f"Depth scaling: {results.dataset} ({results.classes} classes)"
    if note:
        console.print(note)
    acc_cols = ["Depth", "Seeds", "Vanilla acc (%)", "Vanilla", "Lyap. acc (%)", "Lyapunov"]
    acc_cols.append("Δ acc (pp)")
    console.print(
        terminal_table(
            f"{title}: test accuracy at the validation-selected epoch, mean over seeds",
            acc_cols,
            _accuracy_rows(results.rows),
            right=["Depth", "Seeds", "Vanilla acc (%)", "Lyap. acc (%)", "Δ acc (pp)"],
        )
    )
    health_cols = ["Depth", "Van. λ̂", "Lyap. λ̂", "Van. ∇norm", "Lyap. ∇norm", "Van. κ", "Lyap. κ"]
    console.print(
        terminal_table(
            "Gradient health (λ̂ health-probe Lyapunov exponent; κ median Jacobian condition)",
            health_cols,
            _health_rows(results.rows),
            right=health_cols,
        )
    )
    failures = [
        f"depth {r['depth']}: {'; '.join(r['failures'])}" for r in results.rows if r["failures"]
    ]
    if failures:
        console.print("[bold]Runs with failure flags[/bold]")
        for f in failures:
            console.print(f"- {f}")
    v = results.verdict
    for line in v.answer_lines(CANDIDATE, BASELINE):
        question, answer = line.split(": ", 1)
        console.print(f"[bold]{escape(question)}[/bold]: {escape(answer)}", highlight=False)
    console.print(f"[bold]Verdict[/bold]: {escape(v.sentence)}", highlight=False)
    for o in v.observations:
        console.print(f"- {escape(o)}")
    for c in results.conditioning:
        console.print(f"- {c}")
