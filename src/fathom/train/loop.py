"""The one training loop: epoch plans, a stepper, boundaries, checkpoints, exact resume.

``train(cfg, run_dir)`` builds the run's parts from its config (model by ``model.kind``,
optimizer, gate controller, stepper: eager, CUDA graph or regularized), then for each epoch
draws the plan (:mod:`fathom.train.plan`), lets the stepper run it on the training clock,
and records the boundary (:mod:`fathom.train.observe`). Three clocks are kept apart
(DESIGN.md): training (optimizer steps only), evaluation and telemetry (their own work) and
elapsed wall time of the invocation(s).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fathom.base.interrupts import interrupts_unwrapped, uninterrupted
from fathom.base.io import config_digest, read_jsonl, state_dict_digest
from fathom.base.provenance import resolve_device, source_hash
from fathom.base.terminal import OnProgress
from fathom.base.units import fmt_percent
from fathom.config import LiveConfig, RunConfig, describe_config_change, validate_run_config
from fathom.config.models import schedule_due
from fathom.data import DataSplits
from fathom.data.prepare import prepare_splits as _prepare
from fathom.errors import FathomError
from fathom.rundir import RunDir, RunWriter
from fathom.rundir.sections import Status
from fathom.rundir.weights import cpu_state, extra_state, load_cpu_state, load_extra_state
from fathom.train.guards import disk_full_advice, matmul_precision, recorded_threads
from fathom.train.observe import boundary_schedule, observe, sync
from fathom.train.plan import plan_epoch
from fathom.train.session import Session, build_session
from fathom.train.state import PROGRESS_FIELDS, Progress, chain
from fathom.train.steppers import run_timed


def _interrupted_reason(run_dir: Path) -> str:
    """``status_reason`` of a run stopped by Ctrl-C or SIGTERM (status ``interrupted``)."""
    return f"interrupted (Ctrl-C or SIGTERM); continue with `fathom train --resume {run_dir}`"


@dataclass
class RunResult:
    run_dir: Path
    status: str
    epochs_completed: int
    final_params: str | None
    diverged_epoch: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


def prepare_splits(cfg: RunConfig, device: torch.device) -> DataSplits:
    """The run's splits (:func:`fathom.data.prepare.prepare_splits` of ``cfg.data``)."""
    return _prepare(cfg.data, device)


def check_resumable(run_dir: Path, cfg: RunConfig | None) -> RunConfig:
    """Validate that ``run_dir`` can be resumed (and by ``cfg``, if given); return its config."""
    rd = RunDir(run_dir)
    if rd.status == "complete":
        raise FathomError(f"run {str(run_dir)!r} is already complete; nothing to resume")
    stored, recorded_hash = rd.config, rd.recorded.config_hash
    if cfg is not None and config_digest(cfg.model_dump(mode="json")) != recorded_hash:
        why = describe_config_change(
            stored.model_dump(mode="json"), recorded_hash, cfg.model_dump(mode="json")
        )
        raise FathomError(
            f"run {str(run_dir)!r} was started with another config ({why}); "
            "resume without a config, or start a new run directory"
        )
    return stored


@interrupts_unwrapped()  # check_resumable's, before the writer
def train(
    cfg: RunConfig,
    run_dir: str | Path,
    *,
    splits: DataSplits | None = None,
    resume: bool = False,
    telemetry: bool | None = None,
    progress: OnProgress | None = None,
    phase: str | None = None,
    allow_source_change: bool = False,
) -> RunResult:
    """Train ``cfg`` into ``run_dir``; return the result (a diverged run is a result, not an error).

    ``telemetry`` overrides ``cfg.telemetry.enabled``. ``progress`` is an optional callable
    ``progress(event: str, info: dict)`` used by the CLI for live display: ``"epoch"`` with
    each history row as it is written, ``"epoch_end"`` after every epoch (epoch, epochs,
    step, running loss, the training, evaluation and telemetry clocks), ``"step"`` before
    each step (epoch, epochs, steps done in the epoch, steps;
    :func:`fathom.train.steppers.step_ticker`), ``"schedule"`` once before the first epoch
    trained (the epochs that will evaluate and run instruments:
    :func:`fathom.train.observe.boundary_schedule`) and ``"boundary"`` when an epoch's
    training ends and its evaluation or instruments begin (epoch, epochs, the splits
    evaluated, whether instruments run).

    The run directory is written through one :class:`fathom.rundir.RunWriter` (locked for
    the whole call); ``phase`` ("tuning" / "main") is recorded for a study's run. A resume
    whose source changed is refused unless ``allow_source_change`` (then recorded).
    """
    t_invocation = time.perf_counter()
    run_dir = Path(run_dir)
    device = resolve_device(cfg.device)
    if resume:
        check_resumable(run_dir, cfg)  # before locking: never create a missing directory
    writer = RunWriter(run_dir).acquire()
    s = None
    try:
        with interrupts_unwrapped():  # Ctrl-C inside a serializer: the interrupt, not a failure
            state = None
            if resume:  # None: a run stopped inside epoch 0 starts again (recorded)
                state = writer.resume(
                    source_hash=source_hash(), allow_source_change=allow_source_change
                )
            with matmul_precision(cfg.execution.precision, device), recorded_threads(writer):
                s = build_session(
                    cfg, writer, device, splits, telemetry, progress, t_invocation, phase
                )
                if state is None:
                    begin(s)
                else:
                    restore(s, state)
                return fit(s)
    except KeyboardInterrupt:  # before the epoch loop (fit records its own)
        writer.interrupted(_interrupted_reason(run_dir))  # resumable
        raise
    except Exception as e:  # a full disk at epoch 0, a corrupt file: recorded, then raised
        _raise_recorded(writer, disk_full_advice(e, s, run_dir), e)
    finally:
        writer.close()


def _raise_recorded(writer: RunWriter, e: BaseException, original: BaseException) -> None:
    """Record the failure ``e`` (``original`` with advice added, or itself), then raise it."""
    unrecorded = writer.record_failure(e)
    if unrecorded is not None:
        raise unrecorded from None
    if e is original:
        raise original
    raise e from None


def begin(s: Session) -> None:
    """A fresh run: the first manifest, epoch 0's row, checkpoint and resume state."""
    s.writer.start()
    observe(s, 0, {"train/loss_running": None, "optim/lr": None})
    if 0 in s.cfg.checkpoints.save_epochs:
        s.save_epoch_checkpoint(0)
    with uninterrupted():  # the resume state and the boundary it records
        _save_resume_state(s)
        s.mark_boundary()
    s.write_manifest()


def _save_resume_state(s: Session) -> None:
    t0 = time.perf_counter()
    state = {
        "model": cpu_state(s.model),
        "model_extra": extra_state(s.model),  # e.g. self-sampling branches' generators
        "optimizer": s.optimizer.state_dict(),
        "controller": s.controller.state_dict() if s.controller is not None else None,
        "shuffle_gen": s.shuffle_gen.get_state(),
        "rng": s.rng_state(),
        **s.progress.to_state(),  # epoch, checkpoints, selected_ckpt at the top: the writer checks them
        "initial_params": {k: v.detach().cpu() for k, v in s.initial_params.items()},
        "stepper": s.stepper.state_dict(),
    }
    if s.recorder is not None:
        state["recorder"] = s.recorder.state_dict()
    s.writer.save_resume(state)
    s.progress.clocks.checkpoint_s += time.perf_counter() - t0


def restore(s: Session, state: dict[str, Any]) -> None:
    """Continue from the verified resume state: every state, RNG and clock as saved."""
    load_cpu_state(s.model, state["model"])
    if "model_extra" in state:  # absent from resume states written before it was kept
        load_extra_state(s.model, state["model_extra"])
    s.optimizer.load_state_dict(state["optimizer"])
    if s.controller is not None:
        s.controller.load_state_dict(state["controller"])
    s.shuffle_gen.set_state(state["shuffle_gen"])
    s.set_rng_state(state["rng"])
    s.progress = Progress.from_state({k: state[k] for k in PROGRESS_FIELDS})
    s.prior_elapsed = s.progress.clocks.elapsed_s
    s.initial_params = {k: v.to(s.device) for k, v in state["initial_params"].items()}
    s.stepper.load_state_dict(state.get("stepper") or {})
    if s.recorder is not None and "recorder" in state:  # absent: saved without telemetry
        s.recorder.load_state_dict(state["recorder"])
    s.mark_boundary()
    s.refresh_manifest()
    s.writer.begin_resumed()


def _all_finite(model: torch.nn.Module) -> bool:
    flags = [torch.isfinite(p).all() for p in model.parameters()]
    return bool(torch.stack(flags).all().item())  # note: sync point (epoch boundary only)


def train_epoch(s: Session, epoch: int) -> dict[str, Any]:
    """Plan and run one epoch on the training clock; return its training fields."""
    cfg, p = s.cfg, s.progress
    s.model.train()
    n_fit = int(s.splits.fit_y.shape[0])
    plan = plan_epoch(epoch, n_fit, cfg.optim.batch_size, s.shuffle_gen, s.controller, cfg.optim)
    p.order_digest = chain(p.order_digest, plan.perm.numpy().tobytes())
    sync(s.device)
    t0 = time.perf_counter()
    loss_sum = run_timed(s.stepper, plan, p.clocks)  # adds the CPU training clock
    p.step += plan.steps
    sync(s.device)
    p.clocks.training_s += time.perf_counter() - t0
    p.mask_digest = chain(p.mask_digest, plan.kept_bits())
    p.epoch = epoch
    running = loss_sum.item() / plan.steps  # note: sync point (epoch boundary only)
    fields = {"train/loss_running": running, "optim/lr": plan.lrs[-1]}
    fields.update(s.stepper.epoch_fields())
    return fields


def _diverged(s: Session, epoch: int, fields: dict[str, Any]) -> str | None:
    """Why the epoch diverged (non-finite loss or parameters): the rate its last step applied
    (``optim/lr``, the plan's) and the base rate where they differ; ``None`` if it did not."""
    running = fields["train/loss_running"]
    if math.isfinite(running) and _all_finite(s.model):
        return None
    what = "training loss" if not math.isfinite(running) else "parameters"
    applied, base = fields["optim/lr"], s.cfg.optim.lr
    rate = f"lr={applied:g}" + ("" if applied == base else f" applied, base optim.lr={base:g}")
    return f"non-finite {what} in epoch {epoch} ({rate})"


def _target_reached(s: Session, epoch: int, row: dict[str, Any] | None) -> str | None:
    """The stop reason when ``stop.target_test_acc`` was first reached at this epoch."""
    target = s.cfg.stop.target_test_acc
    if target is None or row is None or (row.get("test/acc") or 0.0) < target:
        return None
    s.writer.set_stop(
        target_test_acc=target,
        epoch=epoch,
        training_s=s.progress.clocks.training_s,
        elapsed_s=row["clock/elapsed_s"],
    )
    return (
        f"stopped at epoch {epoch}: official test accuracy {fmt_percent(row['test/acc'])} first "
        f"reached the target {fmt_percent(target)} (monitored on the test set, a speed "
        "benchmark rule)"
    )


def _run_epochs(s: Session) -> tuple[Status, str | None, int | None]:
    """Epochs until the last, a divergence or a reached target: ``(status, reason, diverged)``."""
    cfg = s.cfg
    if s.on_progress is not None:
        s.on_progress("schedule", boundary_schedule(s, s.progress.epoch + 1))
    for epoch in range(s.progress.epoch + 1, cfg.optim.epochs + 1):
        fields = train_epoch(s, epoch)
        reason = _diverged(s, epoch, fields)
        if reason is not None:
            s.writer.row({"epoch": epoch, "step": s.progress.step, **fields, "diverged": True})
            return "diverged", reason, epoch
        row = observe(s, epoch, fields)
        if s.on_progress is not None:
            s.on_progress(
                "epoch_end",
                {
                    "epoch": epoch,
                    "epochs": cfg.optim.epochs,
                    "step": s.progress.step,
                    "train/loss_running": fields["train/loss_running"],
                    "clock/training_s": s.progress.clocks.training_s,
                    "clock/evaluation_s": s.progress.clocks.evaluation_s,
                    "clock/telemetry_s": s.progress.clocks.telemetry_s,
                },
            )
        stop = _target_reached(s, epoch, row)
        last = epoch == cfg.optim.epochs or stop is not None
        if epoch in cfg.checkpoints.save_epochs or last:
            s.save_epoch_checkpoint(epoch)
        with uninterrupted():  # the resume state and the boundary it records
            if last or schedule_due(epoch, (), cfg.checkpoints.resume_every, cfg.optim.epochs):
                _save_resume_state(s)
            s.mark_boundary()
        s.write_manifest()
        if stop is not None:
            return "complete", stop, None
    return "complete", None, None


def fit(s: Session) -> RunResult:
    """Run the remaining epochs; record the outcome (failures are recorded, then raised)."""
    try:
        with interrupts_unwrapped():  # Ctrl-C inside a serializer: the interrupt, not a failure
            status, reason, diverged_epoch = _run_epochs(s)
    except KeyboardInterrupt:
        s.refresh_manifest(cut_short=True)
        s.writer.interrupted(_interrupted_reason(s.run_dir))
        raise
    except Exception as e:
        s.refresh_manifest(cut_short=True)
        _raise_recorded(s.writer, disk_full_advice(e, s, s.run_dir), e)
    complete = status == "complete"
    final_hash = state_dict_digest(cpu_state(s.model)) if complete else None
    s.writer.set_final(
        final_params=final_hash,
        epoch=s.progress.epoch if complete else None,
        diverged_epoch=diverged_epoch,
    )
    s.refresh_manifest()
    s.writer.finish(status, reason)  # the last commit
    rows, _ = read_jsonl(s.run_dir / "history.jsonl")
    return RunResult(
        s.run_dir, status, s.manifest.epochs_completed, final_hash, diverged_epoch, rows
    )


@interrupts_unwrapped()
def resume(
    run_dir: str | Path,
    *,
    progress: Any = None,
    telemetry: bool | None = None,
    allow_source_change: bool = False,
    live: LiveConfig | None = None,
    splits: DataSplits | None = None,
) -> RunResult:
    """Continue an interrupted run from its last resume state; ends byte-identical.

    ``live``: the live-tracking settings to record for this invocation (they never train).
    ``splits``: the data given to :func:`train` when the run was started with data of its
    own (checked against the recorded data digests like data read from the config).
    """
    rd = RunDir(run_dir)
    cfg = validate_run_config(rd.header.config, origin=f"{run_dir}/manifest.json")
    if live is not None:
        cfg = cfg.model_copy(update={"live": live})
    return train(
        cfg,
        run_dir,
        splits=splits,
        resume=True,
        progress=progress,
        telemetry=telemetry,
        phase=rd.phase,
        allow_source_change=allow_source_change,
    )
