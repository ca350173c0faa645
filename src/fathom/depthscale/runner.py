"""Train every (depth, arm, seed) of the benchmark into its own run directory.

One run: SGD with Nesterov momentum and a per-step cosine learning rate, minibatches from a
seeded permutation of the fitting set, loss ``CE + λ_reg · P`` (:mod:`fathom.dynamics.regularizer`).
At every epoch boundary (epoch 0 = before training): dense fit / val / test accuracy and
CE; every ``health_every`` epochs and at the last one, on ``probe_size`` fixed validation
examples: λ̂ (maximal depth-wise Lyapunov exponent, own generator), the float64
input-output Jacobian spectrum and spiking firing rates. Instruments run in eval mode on
their own generator and never touch parameters, optimizer or training RNG.

Clocks: training (optimizer steps, synchronized), evaluation, telemetry (health),
checkpoint, elapsed (whole run, set-up included) are kept apart.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fathom.data import DataSplits, load_raw, make_splits
from fathom.depthscale.config import DepthScaleConfig
from fathom.depthscale.data import AUGMENTATION, ImagePrep, channels, crop_flip, normalize, to_32
from fathom.dynamics.health import firing_rates, jacobian_health
from fathom.dynamics.lyapunov import model_lyapunov
from fathom.dynamics.regularizer import regularized_gradients
from fathom.io import (
    append_jsonl,
    atomic_write_json,
    config_digest,
    ensure_writable_dir,
    state_dict_digest,
)
from fathom.models.convnet import StagedConvNet, blocks_per_stage_for_depth, count_parameters
from fathom.provenance import environment, resolve_device, source_hash
from fathom.train.checkpoint import cpu_state, save_weights
from fathom.train.evaluate import split_scores

FORMAT = 1
ARMS: tuple[str, str] = ("vanilla", "Lyapunov")
Progress = Callable[[str, dict[str, Any]], None]


def stream_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for one named RNG stream of a run (init, order, augment, probe)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{stream}".encode()).digest()[:8], "little") >> 1


def arm_weight(cfg: DepthScaleConfig, arm: str) -> float:
    return 0.0 if arm == "vanilla" else cfg.lyap_weight


def build_model(cfg: DepthScaleConfig, depth: int, classes: int) -> StagedConvNet:
    return StagedConvNet(
        blocks_per_stage=blocks_per_stage_for_depth(depth),
        classes=classes,
        neuron=cfg.neuron,
        timesteps=cfg.timesteps,
        residual=cfg.residual,
        batchnorm=cfg.batchnorm,
        width_mult=cfg.width_mult,
        in_channels=channels(cfg.dataset),
    )


def load_splits(cfg: DepthScaleConfig, device: torch.device) -> tuple[DataSplits, int]:
    """Verified splits (fathom.data errors, e.g. a missing CIFAR archive, reach the user)."""
    raw = load_raw(cfg.dataset, cfg.data_dir)
    splits = make_splits(
        raw,
        mode="fit-val",
        seed=cfg.split_seed,
        fit_subset=cfg.fit_subset,
        eval_subset=cfg.eval_subset,
        device=device,
    )
    to_32(splits.fit_x[:1], cfg.dataset)  # the image-size check, before any training
    return splits, raw.classes


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: a CPU-GPU sync point (clock boundaries only)


@dataclass
class RunOutcome:
    run_dir: Path
    status: str
    status_reason: str | None
    history: list[dict[str, Any]]


def train_run(
    cfg: DepthScaleConfig,
    splits: DataSplits,
    classes: int,
    depth: int,
    arm: str,
    seed: int,
    run_dir: Path,
    *,
    study: str = "depth_scaling",
    progress: Progress | None = None,
) -> RunOutcome:
    """Train one (depth, arm, seed) and write its run directory; never raises on divergence."""
    t_start = time.perf_counter()
    device = splits.fit_x.device
    weight = arm_weight(cfg, arm)
    torch.manual_seed(stream_seed(seed, "init"))
    model = build_model(cfg, depth, classes).to(device)
    prep = ImagePrep(cfg.dataset)
    evaluator = nn.Sequential(prep, model)
    order_gen = torch.Generator().manual_seed(stream_seed(seed, "order"))
    aug_gen = torch.Generator().manual_seed(stream_seed(seed, "augment"))
    tangent_gen = torch.Generator().manual_seed(stream_seed(seed, "tangents"))
    n_fit = int(splits.fit_y.shape[0])
    steps_per_epoch = math.ceil(n_fit / cfg.batch_size)
    total_steps = cfg.epochs * steps_per_epoch
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.momentum > 0,
        weight_decay=cfg.weight_decay,
    )
    probe_x = prep(splits.val_x[: cfg.probe_size])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    config = {**cfg.model_dump(), "depth": depth, "arm": arm, "seed": seed, "lyap_reg": weight}
    clocks = {
        "training_s": 0.0,
        "evaluation_s": 0.0,
        "telemetry_s": 0.0,
        "telemetry_cold_s": None,
        "checkpoint_s": 0.0,
        "elapsed_s": 0.0,
    }
    initial = cpu_state(model)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "kind": "depth_scaling",
        "run_id": run_dir.name,
        "study": study,
        "status": "running",
        "status_reason": None,
        "config": config,
        "config_hash": config_digest(config),
        "source_hash": source_hash(),
        "data": {
            "dataset": cfg.dataset,
            "files": dict(splits.info.get("files", {})),
            "split_mode": "fit-val",
            "split_seed": cfg.split_seed,
            "split_hash": splits.split_hash,
            "sizes": {
                "fit": n_fit,
                "val": int(splits.val_y.shape[0]),
                "test": int(splits.test_y.shape[0]),
            },
            "classes": classes,
            "image_prep": "28x28 zero-padded to 32x32" if channels(cfg.dataset) == 1 else "32x32",
            "augmentation": AUGMENTATION if cfg.do_augment else None,
        },
        "model": {
            "name": "StagedConvNet",
            "depth": depth,
            "widths": list(model.widths),
            "spiking": model.spiking,
            "timesteps": model.timesteps,
            "parameters": count_parameters(model),
            "repr": repr(model.lif_config) if model.lif_config else None,
        },
        "hashes": {
            "initial_params": state_dict_digest(initial),
            "final_params": None,
            "training_order": None,
            "masks": None,
        },
        "environment": environment(device),
        "clocks": clocks,
        "epochs_completed": 0,
        "steps_completed": 0,
        "diverged_epoch": None,
        "selected": {"epoch": None, "val_ce": None},
        "final": {"epoch": None},
        "checkpoints": {},
        "selected_checkpoint": None,
    }
    history_path = run_dir / "history.jsonl"
    history_path.write_text("")
    history: list[dict[str, Any]] = []
    order_digest = hashlib.sha256(b"depth_scaling")

    def write_manifest() -> None:
        clocks["elapsed_s"] = time.perf_counter() - t_start
        atomic_write_json(run_dir / "manifest.json", manifest)

    def save(name: str, epoch: int, extra: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        meta = {"epoch": epoch, "config_hash": manifest["config_hash"], "run_id": run_dir.name}
        digest = save_weights(run_dir / "checkpoints" / name, cpu_state(model), {**meta, **extra})
        clocks["checkpoint_s"] += time.perf_counter() - t0
        return {"file": f"checkpoints/{name}", "epoch": epoch, "params_sha256": digest}

    def observe(epoch: int, step: int, train: dict[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {"epoch": epoch, "step": step, **train}
        t0 = time.perf_counter()
        for name in ("fit", "val", "test"):
            x, y = getattr(splits, f"{name}_x"), getattr(splits, f"{name}_y")
            row[f"{name}/acc"], row[f"{name}/ce"] = split_scores(
                evaluator, x, y, cfg.eval_batch_size
            )
        _sync(device)
        clocks["evaluation_s"] += time.perf_counter() - t0
        due = epoch % cfg.health_every == 0 or epoch == cfg.epochs
        row.update(dict.fromkeys(HEALTH_KEYS))
        if due:
            t0 = time.perf_counter()
            row.update(health(model, probe_x, stream_seed(seed, f"probe-{epoch}")))
            _sync(device)
            dt = time.perf_counter() - t0
            clocks["telemetry_s"] += dt
            if clocks["telemetry_cold_s"] is None:
                clocks["telemetry_cold_s"] = dt
        row["clock/training_s"] = clocks["training_s"]
        row["clock/evaluation_s"] = clocks["evaluation_s"]
        row["clock/telemetry_s"] = clocks["telemetry_s"]
        row["clock/elapsed_s"] = time.perf_counter() - t_start
        append_jsonl(history_path, row)
        history.append(row)
        val_ce = row["val/ce"]
        best = manifest["selected"]["val_ce"]
        if (
            epoch >= 1
            and val_ce is not None
            and math.isfinite(val_ce)
            and (best is None or val_ce < best)
        ):
            manifest["selected"] = {"epoch": epoch, "val_ce": val_ce}
            manifest["selected_checkpoint"] = save("selected.safetensors", epoch, {"selected": 1})
        if progress is not None:
            progress("epoch", {**row, "depth": depth, "arm": arm, "seed": seed})
        return row

    write_manifest()
    observe(0, 0, dict.fromkeys(TRAIN_KEYS))
    step = 0
    try:
        for epoch in range(1, cfg.epochs + 1):
            perm = torch.randperm(n_fit, generator=order_gen)
            order_digest.update(perm.numpy().astype("<i8").tobytes())
            perm = perm.to(device)
            sums = _EpochSums(device)
            model.train()
            _sync(device)
            t0 = time.perf_counter()
            for start in range(0, n_fit, cfg.batch_size):
                idx = perm[start : start + cfg.batch_size]
                xb = to_32(splits.fit_x[idx], cfg.dataset)
                if cfg.do_augment:
                    xb = crop_flip(xb, aug_gen)
                for group in optimizer.param_groups:
                    group["lr"] = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))
                optimizer.zero_grad(set_to_none=True)
                rec = regularized_gradients(
                    model,
                    normalize(xb, cfg.dataset),
                    splits.fit_y[idx],
                    weight=weight,
                    target=cfg.lyap_target,
                    sub_batch=cfg.lyap_subbatch,
                    measure=False,
                    generator=tangent_gen,
                )
                optimizer.step()
                sums.add(rec, int(idx.shape[0]))
                step += 1
            _sync(device)
            clocks["training_s"] += time.perf_counter() - t0
            train = sums.read(n_fit)  # note: a CPU-GPU sync point (once per epoch)
            manifest["epochs_completed"], manifest["steps_completed"] = epoch, step
            manifest["hashes"]["training_order"] = order_digest.hexdigest()
            if not all(math.isfinite(v) for v in (train["train/ce"], train["grad_norm/total"])):
                manifest["status"] = "diverged"
                manifest["status_reason"] = f"non-finite training loss or gradient in epoch {epoch}"
                manifest["diverged_epoch"] = epoch
                append_jsonl(history_path, {"epoch": epoch, "step": step, **train})
                break
            observe(epoch, step, train)
            write_manifest()
        else:
            manifest["status"] = "complete"
            manifest["final"] = {"epoch": cfg.epochs}
            manifest["checkpoints"][str(cfg.epochs)] = save(
                f"epoch-{cfg.epochs:04d}.safetensors", cfg.epochs, {}
            )
    except Exception as e:  # recorded, then re-raised: the directory tells what happened
        manifest["status"] = "failed"
        manifest["status_reason"] = f"{type(e).__name__}: {e}"
        write_manifest()
        raise
    manifest["hashes"]["final_params"] = state_dict_digest(cpu_state(model))
    write_manifest()
    return RunOutcome(run_dir, manifest["status"], manifest["status_reason"], history)


TRAIN_KEYS = (
    "train/ce",
    "train/acc",
    "train/penalty",
    "train/lyapunov",
    "grad_norm/total",
    "grad_norm/ce",
    "grad_norm/penalty",
)
HEALTH_KEYS = (
    "lyap/probe",
    "lyap/probe_blocks",
    "jac/sigma_max",
    "jac/sigma_min",
    "jac/kappa",
    "jac/stable_rank",
    "jac/numerical_rank",
    "jac/full_rank",
    "jac/probes",
    "jac/rank_floor_rule",
    "jac/ill_conditioned",
    "spike/rates",
    "spike/silent_layers",
)


class _EpochSums:
    """Per-step scalars summed on the device; read once per epoch."""

    def __init__(self, device: torch.device) -> None:
        zero = torch.zeros((), dtype=torch.float64, device=device)
        self.ce, self.correct, self.total, self.gce = (
            zero.clone(),
            zero.clone(),
            zero.clone(),
            zero.clone(),
        )
        self.pen: torch.Tensor | None = None
        self.lyap: torch.Tensor | None = None
        self.gpen: torch.Tensor | None = None
        self.steps = 0

    def add(self, rec: Any, n: int) -> None:
        self.ce += rec.ce.double() * n
        self.correct += rec.correct.double()
        self.total += rec.grad_norm_total.double()
        self.gce += rec.grad_norm_ce.double()
        for name in ("penalty", "lyapunov", "grad_norm_penalty"):
            value = getattr(rec, name)
            if value is not None:
                attr = {"penalty": "pen", "lyapunov": "lyap", "grad_norm_penalty": "gpen"}[name]
                prev = getattr(self, attr)
                setattr(self, attr, value.double() if prev is None else prev + value.double())
        self.steps += 1

    def read(self, n: int) -> dict[str, Any]:
        """Epoch means: CE and accuracy per example (running, train mode), the rest per step."""

        def mean(t: torch.Tensor | None) -> float | None:
            return None if t is None else float(t) / self.steps

        return {
            "train/ce": float(self.ce) / n,
            "train/acc": float(self.correct) / n,
            "train/penalty": mean(self.pen),
            "train/lyapunov": mean(self.lyap),
            "grad_norm/total": mean(self.total),
            "grad_norm/ce": mean(self.gce),
            "grad_norm/penalty": mean(self.gpen),
        }


def health(model: StagedConvNet, probe_x: torch.Tensor, seed: int) -> dict[str, Any]:
    """λ̂ (own generator), float64 Jacobian spectrum and firing rates on the probe examples."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        est = model_lyapunov(model, probe_x, generator=gen)
    row: dict[str, Any] = {
        "lyap/probe": float(est.maximal.mean()),
        "lyap/probe_blocks": [float(v) for v in est.log_gains[:, :, 0].mean(0)],
    }
    row.update(jacobian_health(model, probe_x))
    rates = firing_rates(model, probe_x)
    row["spike/rates"] = {r["layer"]: r["rate"] for r in rates} if rates else None
    row["spike/silent_layers"] = [r["layer"] for r in rates if r["silent"]] if rates else None
    return row


def benchmark_root(cfg: DepthScaleConfig, now: datetime | None = None) -> Path:
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return Path(cfg.runs_dir) / "depth_scaling" / f"{cfg.dataset}_{stamp}"


def run_benchmark(
    cfg: DepthScaleConfig,
    root: Path | None = None,
    *,
    progress: Progress | None = None,
) -> Path:
    """Every depth × arm × seed into ``root`` (default ``runs/depth_scaling/<dataset>_<time>``)."""
    device = resolve_device(cfg.device)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    splits, classes = load_splits(cfg, device)  # data errors surface before any directory
    root = ensure_writable_dir(root or benchmark_root(cfg))
    atomic_write_json(root / "benchmark.json", {"config": cfg.model_dump(), "classes": classes})
    for depth in cfg.depths:
        for arm in ARMS:
            for seed in cfg.seeds:
                run_dir = root / run_name(depth, arm, seed)
                if progress is not None:
                    progress(
                        "start", {"depth": depth, "arm": arm, "seed": seed, "run_dir": str(run_dir)}
                    )
                outcome = train_run(
                    cfg,
                    splits,
                    classes,
                    depth,
                    arm,
                    seed,
                    run_dir,
                    study=root.name,
                    progress=progress,
                )
                if progress is not None:
                    progress(
                        "end", {"depth": depth, "arm": arm, "seed": seed, "status": outcome.status}
                    )
    return root


def run_name(depth: int, arm: str, seed: int) -> str:
    return f"d{depth:02d}-{arm.lower()}-s{seed}"
