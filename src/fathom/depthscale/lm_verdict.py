"""The language model's depth-scaling table: every run of the benchmark read through
:class:`fathom.rundir.RunDir` into a :class:`~fathom.stats.lm_scaling.LMRunRecord`
(``ce``: the test nats/token at the epoch of minimum validation nats/token; ``unigram_ce``:
the run's ``data.info.unigram_val_ce``), judged by
:func:`fathom.stats.lm_scaling.lm_depth_verdict` (the rule, LayerDrop against dense, level and
trend apart), and written as ``table.md`` and ``table.json`` (the verdict with its typed
results, which :func:`fathom.stats.claims.check` re-derives from the recorded runs).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

from fathom.base.io import atomic_write_json, atomic_write_text
from fathom.base.units import fmt_value
from fathom.depthscale.lm import LM_ARMS, LM_BENCHMARK
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.stats.lm_scaling import LMRunRecord, LMVerdict, lm_depth_verdict

BASELINE, CANDIDATE = LM_ARMS


def _read_lm_run(path: Path) -> LMRunRecord:
    """A :class:`LMRunRecord` from one run directory of the language-model benchmark."""
    rd = RunDir(path)
    if rd.kind != "run" or rd.config.tags.get("benchmark") != LM_BENCHMARK:
        raise FathomError(
            f"{str(path)!r} is not a run of the language-model depth-scaling benchmark (no "
            f"benchmark = {LM_BENCHMARK!r} tag); pass that benchmark's output directory"
        )
    cfg, recorded = rd.config, rd.recorded
    sel_epoch = recorded.selected.epoch
    row = next((r for r in rd.history() if r.get("epoch") == sel_epoch and sel_epoch), None)
    return LMRunRecord(
        depth=int(cfg.tags["depth"]),
        arm=str(cfg.tags["arm"]),
        seed=int(cfg.seed),
        status=rd.status,
        ce=None if row is None else row.get("test/ce"),
        unigram_ce=recorded.data.info.unigram_val_ce,
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
    verdict = lm_depth_verdict(records, (BASELINE, CANDIDATE))
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
