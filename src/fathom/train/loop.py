"""The training loop: eager SGD steps, evaluation cadence, checkpoints, exact resume.

Three clocks are kept apart (DESIGN.md): the training clock (optimizer steps only), the
evaluation and telemetry clocks (their own work) and elapsed wall time of the invocation.
"""

from __future__ import annotations

import hashlib
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fathom.config import RunConfig, config_diff, validate_run_config
from fathom.data import DataSplits, load_raw, make_splits
from fathom.errors import FathomError
from fathom.io import config_digest, read_jsonl, state_dict_digest
from fathom.provenance import environment, resolve_device, source_hash
from fathom.rundir import FORMAT, RunDir, RunWriter
from fathom.rundir.errors import failure_record
from fathom.train.allocator import tune_cpu_allocator
from fathom.train.build import build_controller, build_optimizer, init_model, stream_seed
from fathom.train.checkpoint import cpu_state, load_cpu_state
from fathom.train.context import EpochContext
from fathom.train.evaluate import split_scores
from fathom.train.fast import make_stepper, plan_epoch


@dataclass
class Clocks:
    training_s: float = 0.0
    evaluation_s: float = 0.0
    telemetry_s: float = 0.0
    telemetry_cold_s: float | None = None
    checkpoint_s: float = 0.0
    elapsed_s: float = 0.0


@dataclass
class RunResult:
    run_dir: Path
    status: str
    epochs_completed: int
    final_params: str | None
    diverged_epoch: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


def eval_due(cfg: RunConfig, epoch: int) -> bool:
    """Evaluate at epoch 0, at ``eval.first``, every ``eval.every`` epochs, and at the last.

    With a stopping target (``stop.target_test_acc``) every epoch is evaluated.
    """
    e = cfg.eval
    if cfg.stop.target_test_acc is not None:
        return True
    return epoch == 0 or epoch in e.first or epoch % e.every == 0 or epoch == cfg.optim.epochs


def _chain(prev: str, payload: bytes) -> str:
    return hashlib.sha256(prev.encode() + payload).hexdigest()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: CPU-GPU sync point (epoch boundary only)


def prepare_splits(cfg: RunConfig, device: torch.device) -> DataSplits:
    raw = load_raw(cfg.data.dataset, cfg.data.data_dir)
    return make_splits(
        raw,
        mode=cfg.data.split,
        seed=cfg.data.split_seed,
        fit_subset=cfg.data.fit_subset,
        eval_subset=cfg.data.eval_subset,
        device=device,
    )


def split_classes(splits: DataSplits) -> int:
    return int(getattr(splits, "classes", None) or splits.info.get("classes") or 10)


def _dataset_record(splits: DataSplits, cfg: RunConfig) -> dict[str, Any]:
    info = dict(splits.info)
    info["classes"] = split_classes(splits)
    info["in_features"] = int(splits.fit_x[0].numel())
    return {
        "dataset": cfg.data.dataset,
        "files": info.pop("files", {}),
        "split_mode": cfg.data.split,
        "split_seed": cfg.data.split_seed,
        "split_hash": splits.split_hash,
        "sizes": {
            "fit": int(splits.fit_y.shape[0]),
            "val": int(splits.val_y.shape[0]),
            "test": int(splits.test_y.shape[0]),
        },
        "info": info,
    }


def _rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["torch_cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch_cpu"])
    if device.type == "cuda" and "torch_cuda" in state:
        torch.cuda.set_rng_state(state["torch_cuda"], device)


def _all_finite(model: torch.nn.Module) -> bool:
    flags = [torch.isfinite(p).all() for p in model.parameters()]
    return bool(torch.stack(flags).all().item())  # note: sync point (epoch boundary only)


def check_resumable(run_dir: Path, cfg: RunConfig | None) -> RunConfig:
    """Validate that ``run_dir`` can be resumed (and by ``cfg``, if given); return its config."""
    rd = RunDir(run_dir)
    status = rd.manifest.get("status")
    if status == "complete":
        raise FathomError(f"run {str(run_dir)!r} is already complete; nothing to resume")
    stored = rd.config
    if cfg is not None and config_digest(cfg.model_dump(mode="json")) != rd.manifest.get(
        "config_hash"
    ):
        diff = config_diff(stored.model_dump(mode="json"), cfg.model_dump(mode="json"))
        raise FathomError(
            f"run {str(run_dir)!r} was started with another config ({'; '.join(diff)}); "
            "resume without a config, or start a new run directory"
        )
    return stored


def train(
    cfg: RunConfig,
    run_dir: str | Path,
    *,
    splits: DataSplits | None = None,
    resume: bool = False,
    telemetry: bool | None = None,
    progress: Any = None,
    phase: str | None = None,
    allow_source_change: bool = False,
) -> RunResult:
    """Train ``cfg`` into ``run_dir``; return the result (a diverged run is a result, not an error).

    ``telemetry`` overrides ``cfg.telemetry.enabled``. ``progress`` is an optional callable
    ``progress(event: str, info: dict)`` used by the CLI for live display: ``"epoch"`` with
    each history row as it is written, ``"epoch_end"`` after every epoch (epoch, epochs,
    step, running loss, training clock).

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
    try:
        state = None
        if resume:
            state = writer.resume(
                source_hash=source_hash(), allow_source_change=allow_source_change
            )
        with matmul_precision(cfg.execution.precision, device):
            return _train(
                cfg, writer, device, splits, state, telemetry, progress, t_invocation, phase
            )
    except KeyboardInterrupt:
        if writer.manifest is not None:
            writer.manifest["status_reason"] = "interrupted; continue with fathom train --resume"
        writer.interrupted()  # status stays "running": the run can be resumed
        raise
    except FathomError as e:  # a full disk, a corrupt file, bad input: recorded, then raised
        writer.fail(str(e), failure=failure_record(e))
        raise
    except Exception as e:
        writer.fail(f"{type(e).__name__}: {e}", failure=failure_record(e))
        raise
    finally:
        writer.close()


@contextmanager
def matmul_precision(precision: str, device: torch.device):
    """TF32 matmuls on CUDA for ``tf32``/``bf16``; strict FP32 for ``fp32``. Restores flags."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    allow = precision in ("tf32", "bf16") and device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _train(
    cfg, writer, device, splits, state, telemetry, progress, t_invocation, phase
) -> RunResult:
    run_dir, resume = writer.path, state is not None
    allocator_tuned = tune_cpu_allocator() if device.type == "cpu" else False
    if splits is None:
        splits = prepare_splits(cfg, device)
    if splits.fit_y.shape[0] == 0:
        raise FathomError("the fitting split is empty; check data.fit_subset")
    classes = split_classes(splits)
    in_features = int(splits.fit_x[0].numel())

    model = init_model(cfg, classes, in_features)
    initial_state = cpu_state(model)
    initial_hash = state_dict_digest(initial_state)
    model.to(device)
    initial_params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    controller = build_controller(model, cfg)
    optimizer = build_optimizer(model, cfg.optim)
    shuffle_gen = torch.Generator().manual_seed(stream_seed(cfg.seed, "shuffle"))
    torch.manual_seed(stream_seed(cfg.seed, "dropout"))

    use_telemetry = cfg.telemetry.enabled if telemetry is None else telemetry
    recorder = None
    if use_telemetry:
        from fathom.telemetry import Recorder

        recorder = Recorder(
            cfg.telemetry, epochs=cfg.optim.epochs, splits=splits, model=model, seed=cfg.seed
        )

    clocks = Clocks()
    order_digest = mask_digest = hashlib.sha256(b"fathom").hexdigest()
    start_epoch, step = 0, 0
    best: dict[str, Any] = {"epoch": None, "val_ce": None}
    checkpoints: dict[str, Any] = {}
    selected_ckpt: dict[str, Any] | None = None
    prior_elapsed = 0.0
    config_json = cfg.model_dump(mode="json")

    if resume:
        load_cpu_state(model, state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if controller is not None:
            controller.load_state_dict(state["controller"])
        shuffle_gen.set_state(state["shuffle_gen"])
        _set_rng_state(state["rng"], device)
        clocks = Clocks(**state["clocks"])
        prior_elapsed = clocks.elapsed_s
        order_digest, mask_digest = state["order_digest"], state["mask_digest"]
        start_epoch, step = state["epoch"], state["step"]
        best, checkpoints, selected_ckpt = (
            state["best"],
            state["checkpoints"],
            state["selected_ckpt"],
        )
        initial_hash = state["initial_hash"]
        initial_params = {k: v.to(device) for k, v in state["initial_params"].items()}
        if recorder is not None and "recorder" in state and hasattr(recorder, "load_state_dict"):
            recorder.load_state_dict(state["recorder"])

    manifest: dict[str, Any] = {
        "format": FORMAT,
        "kind": "run",
        "phase": phase,
        "run_id": run_dir.name,
        "study": cfg.study,
        "status": "running",
        "status_reason": None,
        "config": config_json,
        "config_hash": config_digest(config_json),
        "source_hash": source_hash(),
        "data": _dataset_record(splits, cfg),
        "hashes": {
            "initial_params": initial_hash,
            "final_params": None,
            "training_order": order_digest,
            "masks": mask_digest,
        },
        "environment": {**environment(device), "cpu_allocator_tuned": allocator_tuned},
        "clocks": {},
        "epochs_completed": start_epoch,
        "steps_completed": step,
        "diverged_epoch": None,
        "selected": best,
        "final": {"epoch": None},
        "checkpoints": checkpoints,
        "selected_checkpoint": selected_ckpt,
        "telemetry": {"enabled": bool(use_telemetry)},
    }
    if resume:
        writer.begin_resumed(manifest)
    else:
        writer.start(manifest)

    def write_manifest() -> None:
        clocks.elapsed_s = prior_elapsed + time.perf_counter() - t_invocation
        manifest["clocks"] = vars(clocks).copy()
        tel = clocks.telemetry_s
        if recorder is not None:  # each instrumented layer: name, type, path, shapes
            manifest["telemetry"]["layers"] = recorder.layer_records()
        manifest["telemetry"].update(
            {
                "total_s": tel,
                "cold_s": clocks.telemetry_cold_s,
                "overhead_ratio": tel / clocks.training_s if clocks.training_s > 0 else None,
                "overhead_ratio_without_cold": (tel - (clocks.telemetry_cold_s or 0.0))
                / clocks.training_s
                if clocks.training_s > 0
                else None,
            }
        )
        writer.commit()

    def save_epoch_checkpoint(epoch: int) -> None:
        t0 = time.perf_counter()
        checkpoints[str(epoch)] = writer.save_weights(
            f"epoch-{epoch:04d}.safetensors",
            cpu_state(model),
            {"epoch": epoch, "config_hash": manifest["config_hash"], "run_id": run_dir.name},
        )
        clocks.checkpoint_s += time.perf_counter() - t0

    def observe(epoch: int, running_loss: float | None) -> dict[str, Any] | None:
        nonlocal selected_ckpt
        evaluate = eval_due(cfg, epoch)
        tel_due = recorder is not None and recorder.due(epoch)
        if not evaluate and not tel_due:
            return None
        row: dict[str, Any] = {"epoch": epoch, "step": step, "train/loss_running": running_loss}
        predictions: dict[str, torch.Tensor] = {}
        if evaluate:
            t0 = time.perf_counter()
            for name in ("fit", "val", "test"):
                x, y = getattr(splits, f"{name}_x"), getattr(splits, f"{name}_y")
                if name not in cfg.eval.splits:
                    row[f"{name}/acc"], row[f"{name}/ce"] = None, None
                    continue
                preds: list[torch.Tensor] | None = [] if tel_due else None
                acc, ce = split_scores(model, x, y, cfg.eval.batch_size, preds)
                row[f"{name}/acc"], row[f"{name}/ce"] = acc, ce
                if preds:
                    predictions[name] = torch.cat(preds)
            _sync(device)
            clocks.evaluation_s += time.perf_counter() - t0
            val_ce = row.get("val/ce")
            if (
                epoch >= 1
                and val_ce is not None
                and math.isfinite(val_ce)
                and (best["val_ce"] is None or val_ce < best["val_ce"])
            ):
                best.update(epoch=epoch, val_ce=val_ce)
                t0 = time.perf_counter()
                entry = writer.save_weights(
                    "selected.safetensors",
                    cpu_state(model),
                    {
                        "epoch": epoch,
                        "config_hash": manifest["config_hash"],
                        "run_id": run_dir.name,
                        "selected": 1,
                    },
                )
                selected_ckpt = {**entry, "epoch": epoch}
                manifest["selected_checkpoint"] = selected_ckpt
                clocks.checkpoint_s += time.perf_counter() - t0
        if tel_due:
            ctx = EpochContext(
                epoch, step, model, optimizer, controller, splits, initial_params, device, cfg
            )
            t0 = time.perf_counter()
            # the instrument reuses this boundary's dense predictions (no second forward pass)
            row.update(recorder.observe(ctx, predictions=predictions or None))
            _sync(device)
            dt = time.perf_counter() - t0
            if clocks.telemetry_cold_s is None:
                clocks.telemetry_cold_s = dt
            clocks.telemetry_s += dt
        row.update(
            {
                "clock/training_s": clocks.training_s,
                "clock/evaluation_s": clocks.evaluation_s,
                "clock/telemetry_s": clocks.telemetry_s,
                "clock/elapsed_s": prior_elapsed + time.perf_counter() - t_invocation,
            }
        )
        writer.row(row)
        if progress is not None:
            progress("epoch", row)
        return row

    def save_resume_state(epoch: int) -> None:
        t0 = time.perf_counter()
        state = {
            "epoch": epoch,
            "step": step,
            "model": cpu_state(model),
            "optimizer": optimizer.state_dict(),
            "controller": controller.state_dict() if controller is not None else None,
            "shuffle_gen": shuffle_gen.get_state(),
            "rng": _rng_state(device),
            "clocks": vars(clocks).copy(),
            "order_digest": order_digest,
            "mask_digest": mask_digest,
            "best": dict(best),
            "checkpoints": dict(checkpoints),
            "selected_ckpt": selected_ckpt,
            "initial_hash": initial_hash,
            "initial_params": {k: v.detach().cpu() for k, v in initial_params.items()},
        }
        if recorder is not None and hasattr(recorder, "state_dict"):
            state["recorder"] = recorder.state_dict()
        writer.save_resume(state)
        clocks.checkpoint_s += time.perf_counter() - t0

    if not resume:
        observe(0, None)
        if 0 in cfg.checkpoints.save_epochs:
            save_epoch_checkpoint(0)
        save_resume_state(0)
        write_manifest()

    n_fit = int(splits.fit_y.shape[0])
    stepper, note = make_stepper(cfg, model, optimizer, controller, splits, device)
    manifest["execution"] = {
        "path": stepper.name,
        "precision": cfg.execution.precision,
        "note": note,
        "graph_limit_branches": cfg.execution.max_graph_branches,
    }
    status, reason, diverged_epoch = "running", None, None
    for epoch in range(start_epoch + 1, cfg.optim.epochs + 1):
        model.train()
        plan = plan_epoch(
            epoch,
            n_fit,
            cfg.optim.batch_size,
            shuffle_gen,
            controller,
            cfg.optim.lr,
            cfg.optim.lr_schedule,
        )
        order_digest = _chain(order_digest, plan.perm.numpy().tobytes())
        _sync(device)
        t0 = time.perf_counter()
        loss_sum = stepper.run_epoch(plan)
        step += plan.steps
        _sync(device)
        clocks.training_s += time.perf_counter() - t0
        n_batches = plan.steps
        mask_digest = _chain(mask_digest, plan.kept_bits())
        manifest["hashes"].update(training_order=order_digest, masks=mask_digest)
        running = loss_sum.item() / n_batches  # note: sync point (epoch boundary only)
        manifest["epochs_completed"], manifest["steps_completed"] = epoch, step
        if not math.isfinite(running) or not _all_finite(model):
            status, diverged_epoch = "diverged", epoch
            reason = f"non-finite {'training loss' if not math.isfinite(running) else 'parameters'} in epoch {epoch} (lr={cfg.optim.lr})"
            writer.row(
                {"epoch": epoch, "step": step, "train/loss_running": None, "diverged": True},
            )
            break
        row = observe(epoch, running)
        if progress is not None:
            progress(
                "epoch_end",
                {
                    "epoch": epoch,
                    "epochs": cfg.optim.epochs,
                    "step": step,
                    "train/loss_running": running,
                    "clock/training_s": clocks.training_s,
                },
            )
        target = cfg.stop.target_test_acc
        reached = target is not None and row is not None and (row.get("test/acc") or 0.0) >= target
        last = epoch == cfg.optim.epochs or reached
        if epoch in cfg.checkpoints.save_epochs or last:
            save_epoch_checkpoint(epoch)
        if epoch % cfg.checkpoints.resume_every == 0 or last:
            save_resume_state(epoch)
        manifest["execution"]["graphs_captured"] = stepper.captured
        write_manifest()
        if reached:
            status = "complete"
            reason = (
                f"stopped at epoch {epoch}: official test accuracy {row['test/acc']:.4f} first "
                f"reached the target {target} (monitored on the test set, a speed benchmark rule)"
            )
            manifest["stop"] = {
                "target_test_acc": target,
                "epoch": epoch,
                "training_s": clocks.training_s,
                "elapsed_s": row["clock/elapsed_s"],
            }
            break
    else:
        status = "complete"

    final_hash = None
    if status == "complete":
        final_hash = state_dict_digest(cpu_state(model))
        manifest["final"] = {"epoch": manifest["epochs_completed"]}
    manifest.update(status=status, status_reason=reason, diverged_epoch=diverged_epoch)
    manifest["hashes"]["final_params"] = final_hash
    write_manifest()
    writer.close()
    rows, _ = read_jsonl(run_dir / "history.jsonl")
    return RunResult(
        run_dir, status, manifest["epochs_completed"], final_hash, diverged_epoch, rows
    )


def resume(
    run_dir: str | Path,
    *,
    progress: Any = None,
    telemetry: bool | None = None,
    allow_source_change: bool = False,
) -> RunResult:
    """Continue an interrupted run from its last resume state; ends byte-identical."""
    rd = RunDir(run_dir)
    cfg = validate_run_config(rd.manifest["config"], origin=f"{run_dir}/manifest.json")
    return train(
        cfg,
        run_dir,
        resume=True,
        progress=progress,
        telemetry=telemetry,
        phase=rd.phase,
        allow_source_change=allow_source_change,
    )
