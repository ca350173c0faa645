"""The language model's depth-scaling table and verdict: LayerDrop against dense, in nats
per token, with the level and the trend answered apart (``docs/statistics.md`` §5).

Per run (read through :class:`fathom.rundir.RunDir`): ``ce``, the test nats/token at the
epoch of minimum validation nats/token; ``ppl = exp(ce)``. The rule, the depth-scaling rule
of :mod:`fathom.stats.scaling` with cross-entropy for accuracy:

1. **Runs.** A run *failed* when it diverged, its score is missing or non-finite, or its test
   nats/token is no lower than the unigram baseline's (``data.info.unigram_val_ce``: byte
   frequencies alone, the language model's chance level). A failed run enters every
   statistic at the unigram baseline: a failure is evidence, never an exclusion. (There is
   no *undetermined* reading: the baseline is a number, not an interval.) An arm that failed
   at every depth: ``no conclusion``.
2. **Depths.** A depth where every run of both arms failed is left out, named; fewer than
   two left: ``no comparison``.
3. **Contrasts**, paired over seeds, ``g_s(d) = ce_cand,s(d) − ce_base,s(d)`` in nats
   (lower is better)::

       level   L_s = (1/K) Σ_{d∈D} g_s(d)
       change  C_s = g_s(d₁) − g_s(d₀)
       slope   B_s = Σ_d (d − d̄) g_s(d) / Σ_d (d − d̄)²      (nats/layer)

   judged by :func:`fathom.stats.judge` in one Holm family with the per-depth comparisons
   (smallest effect ``rules.ce_nats``; ``rules.ce_nats / (d₁ − d₀)`` per layer for the
   slope; resolution ``rules.ce_resolution_nats``).
4. **Answers** (:func:`fathom.stats.scaling_answers.level_verdict` / ``trend_verdict``):
   the level from the level contrast unless a per-depth comparison points the other way
   (then inconclusive); the scaling only from the change and the slope agreeing. A level
   difference alone never says "scales better".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fathom.base.io import atomic_write_json, atomic_write_text
from fathom.base.units import fmt_value
from fathom.depthscale.lm import LM_ARMS, LM_BENCHMARK
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.stats import judge, paired
from fathom.stats.quantities import cross_entropy
from fathom.stats.results import Comparison, Quantity
from fathom.stats.rules import DEFAULT_RULES, Rules
from fathom.stats.scaling_answers import level_verdict, trend_verdict
from fathom.stats.sentences import comparison_text, verdict_words

BASELINE, CANDIDATE = LM_ARMS


@dataclass(frozen=True)
class LMRunRecord:
    """One run's inputs; ``None`` where not recorded."""

    depth: int
    arm: str
    seed: int
    status: str
    ce: float | None
    unigram_ce: float | None
    selected_epoch: int | None = None
    run_dir: str | None = None

    @property
    def ppl(self) -> float | None:
        return None if self.ce is None else math.exp(self.ce)

    @property
    def failed(self) -> bool:
        """Diverged, unscored, or no better than the unigram baseline (module rule 1)."""
        if self.status == "diverged" or self.ce is None or not math.isfinite(self.ce):
            return True
        return self.unigram_ce is not None and self.ce >= self.unigram_ce


def _read_lm_run(path: Path) -> LMRunRecord:
    """A :class:`LMRunRecord` from one run directory of the language-model benchmark."""
    rd = RunDir(path)
    if rd.kind != "run" or rd.config.tags.get("benchmark") != LM_BENCHMARK:
        raise FathomError(
            f"{str(path)!r} is not a run of the language-model depth-scaling benchmark (no "
            f"benchmark = {LM_BENCHMARK!r} tag); pass that benchmark's output directory"
        )
    cfg = rd.config
    sel_epoch = (rd.manifest.get("selected") or {}).get("epoch")
    row = next((r for r in rd.history() if r.get("epoch") == sel_epoch and sel_epoch), None)
    return LMRunRecord(
        depth=int(cfg.tags["depth"]),
        arm=str(cfg.tags["arm"]),
        seed=int(cfg.seed),
        status=rd.status,
        ce=None if row is None else row.get("test/ce"),
        unigram_ce=(rd.manifest["data"].get("info") or {}).get("unigram_val_ce"),
        selected_epoch=sel_epoch,
        run_dir=str(path),
    )


def _read_lm_runs(root: Path) -> list[LMRunRecord]:
    """Every run under ``root``, each checked by :meth:`RunDir.problems` first (a damaged run
    is refused, naming it, never read into the verdict)."""
    dirs = sorted(p for p in Path(root).iterdir() if (p / "manifest.json").exists())
    if not dirs:
        raise FathomError(f"no run directories under {str(root)!r}; run the benchmark first")
    damaged = {p.name: RunDir(p).problems() for p in dirs}
    damaged = {k: v for k, v in damaged.items() if v}
    if damaged:
        listed = "; ".join(f"{k}: {', '.join(v)}" for k, v in damaged.items())
        raise FathomError(
            f"{len(damaged)} run(s) under {str(root)!r} fail their integrity checks ({listed}); "
            "rerun the same benchmark into this directory to retrain them"
        )
    return [_read_lm_run(p) for p in dirs]


@dataclass
class LMVerdict:
    """The two answers, the sentences they rest on, and every judged comparison."""

    level: str
    trend: str
    lines: list[str]
    depths: list[int] = field(default_factory=list)
    left_out: list[int] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "trend": self.trend,
            "lines": self.lines,
            "depths": self.depths,
            "left_out": self.left_out,
            "comparisons": [c.to_dict() for c in self.comparisons],
        }


def _entered(r: LMRunRecord) -> float:
    """The value a run enters the statistics with: its nats/token, or the baseline if failed."""
    if r.failed:
        if r.unigram_ce is None:
            raise FathomError(
                f"run {r.run_dir} failed and records no unigram baseline to enter it at; "
                "retrain it with this version (data.info.unigram_val_ce)"
            )
        return r.unigram_ce
    assert r.ce is not None
    return r.ce


def lm_depth_verdict(records: list[LMRunRecord], rules: Rules = DEFAULT_RULES) -> LMVerdict:
    """Level and scaling of LayerDrop against dense (module docstring)."""
    by: dict[tuple[int, str], dict[int, LMRunRecord]] = {}
    for r in records:
        by.setdefault((r.depth, r.arm), {})[r.seed] = r
    depths_all = sorted({r.depth for r in records})
    seeds = sorted({r.seed for r in records})
    missing = [
        f"{arm} at depth {d}"
        for d in depths_all
        for arm in LM_ARMS
        if sorted(by.get((d, arm), {})) != seeds
    ]
    if missing:
        why = f"no comparison: runs missing ({', '.join(missing)}); every depth and arm needs every seed"
        return LMVerdict("no comparison", "no comparison", [why])
    for arm in LM_ARMS:
        if all(by[(d, arm)][s].failed for d in depths_all for s in seeds):
            line = f"no conclusion: the {arm} arm failed (diverged, or its nats/token never got below the unigram baseline's) at every depth"
            return LMVerdict("no conclusion", "no conclusion", [line])
    left = [d for d in depths_all if all(by[(d, a)][s].failed for a in LM_ARMS for s in seeds)]
    depths = [d for d in depths_all if d not in left]
    if len(depths) < 2:
        why = f"no comparison: {len(depths)} depth(s) where an arm did not fail on every seed; the two questions need two"
        return LMVerdict("no comparison", "no comparison", [why], depths, left)
    v = {(d, a, s): _entered(by[(d, a)][s]) for d in depths for a in LM_ARMS for s in seeds}
    k, lo, hi = len(depths), depths[0], depths[-1]
    mean_d = math.fsum(depths) / k
    ss = math.fsum((d - mean_d) ** 2 for d in depths)
    w = {d: (d - mean_d) / ss for d in depths}
    slope_q = Quantity(
        name="least-squares slope of test nats/token over depth (nats per layer)",
        unit="nats",
        higher_is_better=False,
        smallest_effect=rules.ce_nats / (hi - lo),
        resolution=rules.ce_resolution_nats / (hi - lo),
    )
    listed = ", ".join(str(d) for d in depths)

    def item(cid: str, q: Quantity, f, scope: str):
        a, b = ({s: f(arm, s) for s in seeds} for arm in (CANDIDATE, BASELINE))
        return paired(cid, q, a, b, names=(CANDIDATE, BASELINE), context={"scope": scope})

    items = [
        item("level", cross_entropy("test nats/token", rules),
             lambda a, s: math.fsum(v[(d, a, s)] for d in depths) / k, f"mean over depths {listed}"),
        item("change", cross_entropy("change in test nats/token with depth", rules),
             lambda a, s: v[(hi, a, s)] - v[(lo, a, s)], f"from depth {lo} to depth {hi}"),
        item("slope", slope_q, lambda a, s: math.fsum(w[d] * v[(d, a, s)] for d in depths),
             f"across depths {listed}"),
        *(item(f"depth {d}", cross_entropy("test nats/token", rules),
               lambda a, s, d=d: v[(d, a, s)], f"depth {d}") for d in depths),
    ]  # fmt: skip
    comps = judge("language-model depth scaling", items, rules)
    level_c, change, slope = comps[:3]
    per_depth = dict(zip(depths, comps[3:]))
    level = level_verdict(level_c, per_depth, [])
    trend = trend_verdict(change, slope)
    lines = [
        f"level ({CANDIDATE} vs {BASELINE} across the depths): {level} — "
        f"{level_c.quantity.name} {level_c.context['scope']}: {verdict_words(level_c)} "
        f"({comparison_text(level_c)})",
        f"scaling ({CANDIDATE} vs {BASELINE}, how their difference changes with depth): {trend} — "
        f"{change.quantity.name} {change.context['scope']}: {verdict_words(change)} "
        f"({comparison_text(change)}); {slope.quantity.name} {slope.context['scope']}: "
        f"{verdict_words(slope)} ({comparison_text(slope)})",
        "per depth: " + "; ".join(f"depth {d} {verdict_words(c)}" for d, c in per_depth.items()),
    ]
    if left:
        lines.append(f"left out: depth(s) {left} (both arms failed on every seed)")
    return LMVerdict(level, trend, lines, depths, left, comps)


def _cell(rs: list[LMRunRecord]) -> str:
    vals = [r.ce for r in rs if r.ce is not None]
    mean = math.fsum(vals) / len(vals) if vals and len(vals) == len(rs) else None
    return fmt_value(mean, "nats", suffix=False)


def _lm_table_markdown(records: list[LMRunRecord], verdict: LMVerdict, note: str = "") -> str:
    """``table.md``: mean test nats/token and perplexity per depth and arm, then the verdict."""
    lines = ["# Depth scaling of a language model: LayerDrop vs dense", ""]
    if note:
        lines += [note, ""]
    lines += [
        "| depth | dense nats/token | dense ppl | LayerDrop nats/token | LayerDrop ppl | failed runs |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for d in sorted({r.depth for r in records}):
        cells = {a: [r for r in records if r.depth == d and r.arm == a] for a in LM_ARMS}
        ppl = {
            a: fmt_value(
                math.fsum(r.ppl for r in rs if r.ppl is not None) / len(rs)
                if rs and all(r.ppl is not None for r in rs)
                else None,
                "",
            )
            for a, rs in cells.items()
        }
        failed = [f"{r.arm} s{r.seed}" for a in LM_ARMS for r in cells[a] if r.failed]
        lines.append(
            f"| {d} | {_cell(cells[BASELINE])} | {ppl[BASELINE]} | {_cell(cells[CANDIDATE])} | "
            f"{ppl[CANDIDATE]} | {', '.join(failed) or '—'} |"
        )
    lines += [
        "",
        f"**Level:** {verdict.level}.",
        "",
        f"**Scaling:** {verdict.trend}.",
        "",
        "**Verdict:**",
        "",
        *(f"- {line}" for line in verdict.lines),
        "",
        "Test nats/token at the epoch of minimum validation nats/token, mean over seeds; "
        "perplexity = exp(nats/token), the mean of the seeds' perplexities. A run failed when it "
        "diverged or its nats/token did not get below the unigram baseline's (byte frequencies alone).",
        "",
    ]
    return "\n".join(lines)


def write_lm_table(root: Path, note: str = "") -> LMVerdict:
    """Read the runs under ``root``; write ``table.md`` and ``table.json``; the verdict."""
    records = _read_lm_runs(root)
    verdict = lm_depth_verdict(records)
    atomic_write_text(Path(root) / "table.md", _lm_table_markdown(records, verdict, note))
    atomic_write_json(
        Path(root) / "table.json",
        {
            "kind": LM_BENCHMARK,
            "metric": "test nats/token at the epoch of minimum validation nats/token",
            "runs": [asdict(r) | {"ppl": r.ppl, "failed": r.failed} for r in records],
            "verdict": verdict.to_dict(),
        },
    )
    return verdict
