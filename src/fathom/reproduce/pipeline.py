"""``fathom reproduce``: study -> audit -> curvature -> head diagnostic -> comparison -> report.

Every step reads the previous steps' files on disk (run directories, ``audit.json``, ...),
never their memory, and is resumable: a step already complete and verified
(:class:`fathom.reproduce.state.PipelineState`) is skipped and says so; an interrupted step
reruns, and the study and head runs inside it resume from their own last epoch boundary.
Outputs, under ``<runs-dir>/<study>/`` (the head pair beside it, in ``<study>-head/``):

* the study's run directories, ``summary.json`` / ``summary.md``;
* ``audit/audit.json`` / ``audit.md``; ``main-<recipe>-s<seed>/curvature/``;
* ``reproduce/reproduction.json`` / ``.md`` (seed numbers beside Fathom's) and
  ``reproduce/pipeline.json`` (the step records); ``report/`` (HTML explorer, figures).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fathom.base.io import atomic_write_json, atomic_write_text, config_digest
from fathom.base.terminal import Say
from fathom.errors import FathomError
from fathom.reproduce.config import PipelineConfig
from fathom.reproduce.state import PipelineState, pipeline_lock
from fathom.rundir import RunDir
from fathom.study.config import StudyConfig
from fathom.study.plan import study_root


class StepContext(Protocol):
    """What :func:`run_step` and :func:`open_state` read of a pipeline's invocation: a study
    pipeline's :class:`Context` or a depth-scaling one's
    (:class:`fathom.reproduce.depth_pipeline.DepthContext`). An ``eta`` attribute
    (:func:`pipeline_eta`), where present, is read with ``getattr``."""

    name: str
    runs_dir: Path
    say: Say
    actions: dict[str, str]
    plan: dict[str, str]
    t0: float

    @property
    def root(self) -> Path: ...


@dataclass
class Context:
    """One invocation: the pipeline, where it writes, how runs execute, what it prints."""

    name: str
    pipe: PipelineConfig
    study: StudyConfig
    runs_dir: Path
    backend: Any
    say: Say
    splits_for: Any = None  # (cfg, device) -> DataSplits: synthetic data in tests
    threads: int = 1
    retry_failed: bool = False
    actions: dict[str, str] = field(default_factory=dict)
    plan: dict[str, str] = field(default_factory=dict)  # step -> what it does, in order
    t0: float = field(default_factory=time.perf_counter)
    eta: Any = None  # fathom.base.eta.WorkEta over the steps (pipeline_eta)

    @property
    def root(self) -> Path:
        return study_root(self.runs_dir, self.study)

    @property
    def head_dir(self) -> Path:
        return self.runs_dir / f"{self.study.study.name}-head"

    def curvature_run(self, recipe: str) -> Path:
        return self.root / f"main-{recipe}-s{self.pipe.curvature.seed}"


def _plan_steps(ctx: Context) -> dict[str, str]:
    """Every step this pipeline runs, in order, with what it does (the ``k/N`` of its lines)."""
    s, a, c, h = ctx.study.study, ctx.pipe.audit, ctx.pipe.curvature, ctx.pipe.head
    runs = len(s.recipes) * len(s.seeds)
    plan = {"study": f"train study {s.name}: {runs} main runs (+ tuning), resumable"}
    if a.enabled:
        plan["audit"] = "remove trained branches of every main run and score each mask"
    if c.enabled:
        epochs = " ".join(str(e) for e in c.epochs)
        for recipe in c.recipes:
            run = ctx.curvature_run(recipe).name
            plan[f"curvature:{run}"] = (
                f"exact float64 curvature of {run} at epochs {epochs} (probe {c.probe})"
            )
    if h.enabled:
        plan["head"] = f"train the ReLU-head / linear-head pair, seed {h.seed}, {h.epochs} epochs"
    plan["compare"] = "put the seed's numbers beside Fathom's (reproduction.md)"
    plan["report"] = "write the HTML explorer, figures and summary.md"
    return plan


def _step_label(ctx: StepContext, step: str) -> str:
    """``[3/8 curvature:main-residual-s101]`` (the step's place in :func:`_plan_steps`)."""
    names = list(ctx.plan)
    k = names.index(step) + 1 if step in names else "?"
    return f"[{k}/{len(names) or '?'} {step}]"


def pipeline_eta(plan: dict[str, str], state: PipelineState) -> Any:
    """The whole pipeline's time left (:class:`fathom.base.eta.WorkEta`), one unit per step
    of ``plan``, its kind the step's name before ``:`` (the curvature steps share one)::

        left = Σ_steps to come cost(kind) + max(0, cost(current) − its elapsed time)

    ``cost(kind)``: the mean wall time of that kind's steps run in this invocation, else
    the mean of their recorded times in ``pipeline.json`` (an earlier run of the same
    steps), else unknown: it counts zero and the ETA is a lower bound (``≥``). A step found
    complete and verified is skipped at no cost and leaves the count; until its line comes
    it was counted at its recorded time (so a resumed pipeline's ETA errs high, never low).
    """
    from fathom.base.eta import WorkEta

    todo: dict[str, int] = {}
    recorded: dict[str, list[float]] = {}
    for step in plan:
        kind = step.split(":")[0]
        todo[kind] = todo.get(kind, 0) + 1
        wall = state.steps.get(step, {}).get("wall_s")
        if wall is not None:
            recorded.setdefault(kind, []).append(float(wall))
    prior = {k: sum(v) / len(v) for k, v in recorded.items()}
    return WorkEta(todo=todo, prior=prior)


def _clock_line(ctx: StepContext) -> str:
    """``pipeline elapsed 3:34, ETA ≥0:30`` (the ETA only where :func:`pipeline_eta` runs)."""
    from fathom.base.terminal import fmt_duration, fmt_eta

    now = time.perf_counter()
    line = f"pipeline elapsed {fmt_duration(now - ctx.t0)}"
    eta = getattr(ctx, "eta", None)  # a depth-scaling pipeline's context has none
    return line if eta is None else f"{line}, ETA {fmt_eta(eta.left(now))}"


def _skipped(ctx: StepContext, step: str, line: str) -> None:
    """Say ``line`` for a skipped step; the step leaves the pipeline's work left."""
    ctx.say(line)
    ctx.actions[step] = "skipped"
    if getattr(ctx, "eta", None) is not None:
        ctx.eta.drop(step.split(":")[0])


def run_step(
    ctx: StepContext, state: PipelineState, step: str, inputs: dict, body: Callable
) -> None:
    """Skip ``step`` when complete and verified, else run ``body() -> outputs`` and record it.
    Its lines say its place (``k/N``), what it does, the pipeline's elapsed time and its ETA
    (:func:`pipeline_eta`; a depth-scaling pipeline's context has none)."""
    label = _step_label(ctx, step)
    done, why = state.check(step, inputs)
    if done:
        _skipped(ctx, step, f"{label} skipped: {why}")
        return
    what = ctx.plan.get(step)
    eta = getattr(ctx, "eta", None)
    if eta is not None:
        eta.begin(step.split(":")[0], time.perf_counter())
    clock = _clock_line(ctx)
    ctx.say(f"{label} running: {what} ({why}; {clock})" if what else f"{label} running ({why})")
    t0 = time.perf_counter()
    outputs = body()
    state.record(step, inputs, outputs, time.perf_counter() - t0)
    ctx.actions[step] = "ran"
    if eta is not None:
        eta.end(time.perf_counter())
    ctx.say(f"{label} done in {time.perf_counter() - t0:.1f} s ({_clock_line(ctx)})")


def _verify_study(ctx: Context) -> list[Path]:
    """Every main run's final checkpoint against its recorded hash (raises on a mismatch)."""
    import json

    from fathom.study.execute import verify_complete

    summary = json.loads((ctx.root / "summary.json").read_text())
    for run_id, r in summary["runs"].items():
        if r["status"] == "complete" and verify_complete(ctx.root / run_id) != r["final_params"]:
            raise FathomError(f"run {run_id}: final parameters differ from summary.json")
    return [ctx.root / "summary.json"]


def _step_study(ctx: Context, state: PipelineState) -> None:
    from fathom.study.runner import run_study

    inputs = {"study": config_digest(ctx.study.to_data())}
    done, why = state.check("study", inputs)
    if done:
        _verify_study(ctx)
        _skipped(
            ctx,
            "study",
            f"{_step_label(ctx, 'study')} skipped: {why}; every main run's final checkpoint "
            "re-verified",
        )
        return

    def body() -> list[Path]:
        from fathom.base.terminal import Tally
        from fathom.study.plan import tuning_specs

        s = ctx.study.study
        tally = Tally(len(tuning_specs(ctx.study, ctx.runs_dir)) + len(s.recipes) * len(s.seeds))

        def progress(event: str, info: Any) -> None:
            if event == "phase":
                ctx.say(f"  {info}")
            else:
                line = tally.add(info.action not in ("skipped", "kept"))
                ctx.say(
                    f"  {info.run_id:<28} {info.action:<7} {info.status:<8} {info.wall_s:6.1f}s"
                    f"  {line}"
                )

        result = run_study(
            ctx.study, ctx.runs_dir, ctx.backend, retry_failed=ctx.retry_failed, progress=progress
        )
        failed = [o.run_id for o in result.outcomes if o.status == "failed"]
        if failed:
            raise FathomError(
                f"study runs {failed} failed (see their manifests' status_reason); the pipeline "
                "stops before the audit. Fix the cause and rerun with --retry-failed"
            )
        return _verify_study(ctx)

    run_step(ctx, state, "study", inputs, body)


def _splits(ctx: Context, cfg: Any, device: str) -> Any:
    from fathom.base.provenance import resolve_device

    return None if ctx.splits_for is None else ctx.splits_for(cfg, resolve_device(device))


def _step_audit(ctx: Context, state: PipelineState) -> None:
    from fathom.audit.run import audit_runs

    a = ctx.pipe.audit
    settings = a.audit_settings()
    inputs = {"study": state.output_digest("study"), "settings": settings.to_dict()}

    def body() -> list[Path]:
        out = ctx.root / "audit"
        splits = _splits(ctx, ctx.study.base, a.device)
        audit_runs(ctx.root, settings, out, splits=splits, progress=lambda m: ctx.say(f"  {m}"))
        return [out / "audit.json", out / "audit.md"]

    run_step(ctx, state, "audit", inputs, body)


def _step_curvature(ctx: Context, state: PipelineState) -> None:
    """One sub-step per central run: its snapshots, skipped per run when verified."""
    from fathom.curvature.rundir import run_curvature

    c = ctx.pipe.curvature
    device = str(_resolve(c.device))
    for recipe in c.recipes:
        run_dir = ctx.curvature_run(recipe)
        rd = RunDir(run_dir)
        hashes = {e: rd.checkpoint_hash(e) for e in c.epochs}
        inputs = {"epochs": list(c.epochs), "probe": c.probe, "checkpoints": hashes}

        def body(rd: RunDir = rd) -> list[Path]:
            if ctx.splits_for is not None:
                rd = _WithSplits(rd.path, ctx)
            say = ctx.say
            run_curvature(
                rd, list(c.epochs), probe=c.probe, device=device, progress=lambda m: say(f"  {m}")
            )
            out = Path(rd.path) / "curvature"
            return [out / "summary.json", *(out / f"epoch-{e:04d}.json" for e in c.epochs)]

        run_step(ctx, state, f"curvature:{run_dir.name}", inputs, body)


def _resolve(device: str) -> Any:
    from fathom.base.provenance import resolve_device

    return resolve_device(device)


class _WithSplits(RunDir):
    """A run directory whose splits come from ``ctx.splits_for`` (synthetic data in tests)."""

    def __init__(self, path: Path, ctx: Context) -> None:
        super().__init__(path)
        self._ctx = ctx

    def load_splits(self, device: Any = "cpu") -> Any:
        return _splits(self._ctx, self.config, str(device))


def _step_head(ctx: Context, state: PipelineState) -> None:
    from fathom.reproduce.head import HeadSettings, head_lines, run_head_diagnostic
    from fathom.study.family import load_run_config_or_preset

    h = ctx.pipe.head
    base = load_run_config_or_preset(h.preset)
    settings = HeadSettings(
        seed=h.seed,
        epochs=h.epochs,
        width_mult=h.width_mult,
        fit_subset=h.fit_subset,
        eval_subset=h.eval_subset,
        lr=h.lr,
    )
    inputs = {"base": config_digest(base.model_dump(mode="json")), "settings": vars(settings)}

    def body() -> list[Path]:
        result = run_head_diagnostic(
            base,
            settings,
            ctx.head_dir,
            splits_for=ctx.splits_for,
            threads=ctx.threads,
            progress=lambda m: ctx.say(f"  {m}"),
        )
        for line in head_lines(result):
            ctx.say(f"  {line}")
        return [ctx.head_dir / "head.json", ctx.head_dir / "head.md"]

    run_step(ctx, state, "head", inputs, body)


def locations(ctx: Context) -> dict[str, str]:
    """Each seed table's counterpart path, with this pipeline's directories filled in."""
    from fathom.reproduce.seeds import load_seeds

    fill = {"study": str(ctx.root), "runs": str(ctx.root), "head": str(ctx.head_dir)}
    return {t.id: t.counterpart.format(**fill) for t in load_seeds().tables_of("study")}


def _step_compare(ctx: Context, state: PipelineState) -> None:
    from fathom.reproduce.compare import comparison
    from fathom.reproduce.compare_md import to_markdown
    from fathom.reproduce.extract import Sources
    from fathom.reproduce.seeds import load_seeds

    c = ctx.pipe.curvature
    inputs = {
        s: state.output_digest(s)
        for s in state.steps
        if s.split(":")[0] in ("study", "audit", "curvature", "head")
    }
    seeds = load_seeds()
    inputs["seeds"] = config_digest(seeds.model_dump(mode="json"))

    def body() -> list[Path]:
        src = Sources.load(
            ctx.root,
            {(r, c.seed): ctx.curvature_run(r) for r in c.recipes} if c.enabled else {},
            ctx.head_dir if ctx.pipe.head.enabled else None,
            {int(k): v for k, v in c.epoch_map.items()},
        )
        result = comparison(seeds, src, pipeline=ctx.name, locations=locations(ctx))
        out = ctx.root / "reproduce"
        atomic_write_json(out / "reproduction.json", result)
        atomic_write_text(out / "reproduction.md", to_markdown(result))
        return [out / "reproduction.json", out / "reproduction.md"]

    run_step(ctx, state, "compare", inputs, body)


def _step_report(ctx: Context, state: PipelineState) -> None:
    from fathom.report.build import build_report

    inputs = {s: state.output_digest(s) for s in state.steps if s != "report"}
    inputs["figures"] = ctx.pipe.report.figures

    def body() -> list[Path]:
        result = build_report(ctx.root, with_figures=ctx.pipe.report.figures)
        return [result.html, result.summary_md]

    run_step(ctx, state, "report", inputs, body)


def open_state(ctx: StepContext, lock: Any) -> PipelineState:
    """The step records under ``ctx.root``, once ``lock`` is held; a stale lock taken over
    (its holder was killed) is recorded and said."""
    state = PipelineState(ctx.root / "reproduce" / "pipeline.json", ctx.runs_dir, ctx.name)
    if lock.stale_pid is not None:
        state.note("stale_lock_taken_over", {"pid": lock.stale_pid})
        ctx.say(f"took over the lock of pipeline PID {lock.stale_pid}, which is no longer alive")
    return state


def reproduce(ctx: Context) -> PipelineState:
    """Run every enabled step in order (see the module docstring), holding the pipeline lock
    on the output directory; return the step records."""
    ctx.plan = ctx.plan or _plan_steps(ctx)
    with pipeline_lock(ctx.root) as lock:
        state = open_state(ctx, lock)
        ctx.eta = pipeline_eta(ctx.plan, state)
        return _run_steps(ctx, state)


def _run_steps(ctx: Context, state: PipelineState) -> PipelineState:
    _step_study(ctx, state)
    if ctx.pipe.audit.enabled:
        _step_audit(ctx, state)
    if ctx.pipe.curvature.enabled:
        _step_curvature(ctx, state)
    if ctx.pipe.head.enabled:
        _step_head(ctx, state)
    _step_compare(ctx, state)
    _step_report(ctx, state)
    return state
