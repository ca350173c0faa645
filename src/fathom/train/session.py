"""A run's live parts, built from its config: the state the loop's pieces share.

:func:`build_session` makes, in this order (the order fixes every RNG draw): the data
splits, the seeded model (``init`` stream, built on the CPU by ``model.kind``), the gate
controller, the optimizer, the shuffle generator, the training RNG (``dropout`` stream), the
recorder, the stepper and the manifest, whose ``data`` and ``telemetry`` sections are typed by
:mod:`fathom.rundir.sections` (``docs/architecture.md`` fixes the fields) and written by
:class:`fathom.rundir.RunWriter`. Nothing here trains.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fathom.base.interrupts import uninterrupted
from fathom.base.io import config_digest, state_dict_digest
from fathom.base.provenance import environment, source_hash
from fathom.base.terminal import OnProgress
from fathom.config import RunConfig
from fathom.config.model_kinds import model_kind
from fathom.data import DataSplits
from fathom.data.paths import paths_base
from fathom.data.prepare import prepare_splits
from fathom.data.registry import registered_shape
from fathom.data.splits import splits_digest
from fathom.depth import GateController
from fathom.errors import FathomError
from fathom.losses.labels import LabelLoss
from fathom.models import count_parameters
from fathom.rundir import FORMAT, RunManifest, RunWriter
from fathom.rundir.inputs import recorded_base, run_data_config
from fathom.rundir.sections import Data, Telemetry
from fathom.rundir.weights import cpu_state
from fathom.telemetry.context import EpochContext
from fathom.train.allocator import tune_cpu_allocator
from fathom.train.build import build_controller, build_optimizer, init_model, stream_seed
from fathom.train.protocols import Recorder, Stepper
from fathom.train.state import Progress, rng_state, set_rng_state
from fathom.train.steppers import make_stepper, step_ticker


@dataclass
class Session:
    cfg: RunConfig
    run_dir: Path
    device: torch.device
    splits: DataSplits
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    controller: GateController | None
    shuffle_gen: torch.Generator
    recorder: Recorder | None
    stepper: Stepper
    writer: RunWriter
    initial_params: dict[str, torch.Tensor]
    on_progress: OnProgress | None = None
    t_invocation: float = 0.0
    prior_elapsed: float = 0.0
    progress: Progress = field(default_factory=Progress)
    completed: Progress | None = None  # the progress at the last complete epoch boundary

    @property
    def tokens(self) -> bool:
        """A next-token model's run (its kind's row says ``tokens``): scored per token."""
        return model_kind(self.cfg.model.kind).tokens

    @property
    def loss(self) -> LabelLoss | None:
        """The ``[loss]`` table's loss of a classifier run, ``None`` for the default
        (cross-entropy, recorded as ``{split}/ce``) and for a next-token model."""
        if self.tokens:
            return None
        loss = LabelLoss.of(self.cfg.loss)
        return None if loss.is_default else loss

    @property
    def manifest(self) -> RunManifest:
        """The manifest the writer holds (read it; change it through the writer's methods)."""
        assert self.writer.manifest is not None
        return self.writer.manifest

    def elapsed(self) -> float:
        return self.prior_elapsed + time.perf_counter() - self.t_invocation

    def rng_state(self) -> dict[str, Any]:
        return rng_state(self.device)

    def set_rng_state(self, state: dict[str, Any]) -> None:
        set_rng_state(state, self.device)

    def context(self, epoch: int, lr: float | None = None) -> EpochContext:
        """What instruments see at this boundary; ``lr``: the rate the epoch's last step
        applied (the plan's, ``optim/lr``)."""
        return EpochContext(
            epoch,
            self.progress.step,
            self.model,
            self.optimizer,
            self.controller,
            self.splits,
            self.initial_params,
            self.device,
            self.cfg,
            lr,
        )

    def health_row(self, epoch: int) -> dict[str, Any]:
        from fathom.dynamics.probe import health_row

        probe = self.splits.val_x[: self.cfg.health.probe_size]
        return health_row(self.model, probe, stream_seed(self.cfg.seed, f"probe-{epoch}"))

    # -- checkpoints and the manifest ----------------------------------------------------
    def save_weights(self, name: str, epoch: int) -> dict[str, Any]:
        """``checkpoints/<name>.safetensors`` of the current weights (on the checkpoint clock)."""
        t0 = time.perf_counter()
        meta: dict[str, Any] = {
            "epoch": epoch,
            "config_hash": self.manifest.config_hash,
            "run_id": self.run_dir.name,
        }
        if name == "selected":
            meta["selected"] = 1
        entry = self.writer.save_weights(f"{name}.safetensors", cpu_state(self.model), meta)
        self.progress.clocks.checkpoint_s += time.perf_counter() - t0
        return {**entry, "epoch": epoch}

    def save_epoch_checkpoint(self, epoch: int) -> None:
        with uninterrupted():  # the file and its entry
            entry = self.save_weights(f"epoch-{epoch:04d}", epoch)
            self.progress.checkpoints[str(epoch)] = {k: v for k, v in entry.items() if k != "epoch"}

    def write_manifest(self) -> None:
        """Bring the manifest up to date with the run's progress; commit."""
        self.refresh_manifest()
        self.writer.commit()

    def mark_boundary(self) -> None:
        """The current epoch's boundary is written (row, checkpoints, resume state): remember
        its progress as the last complete one (see :meth:`refresh_manifest`)."""
        self.completed = Progress.from_state(self.progress.to_state())

    def refresh_manifest(self, *, cut_short: bool = False) -> None:
        """Record the run's progress through the writer (:meth:`RunWriter.progress`), without
        committing.

        ``cut_short``: the run stops inside an epoch (Ctrl-C, a failure). Its epoch counts,
        step count, training-order and mask digests and clocks are then those of the last
        complete boundary (:meth:`mark_boundary`), the point a resume continues from, never
        those of the epoch in flight. The checkpoint entries stay the current ones: they
        describe the weights files on disk, which that epoch may already have rewritten.
        """
        p = self.progress
        p.clocks.elapsed_s = self.elapsed()
        done = self.completed if cut_short and self.completed is not None else p
        # each instrumented layer: name, type, path, shapes
        rec = self.recorder
        layers = rec.layer_records() if rec is not None else None
        changes = [dict(c) for c in rec.schema_changes] if rec is not None else None
        self.writer.progress(
            epochs_completed=done.epoch,
            steps_completed=done.step,
            clocks=vars(done.clocks),
            telemetry=_telemetry_record(
                done.clocks, rec is not None, layers, changes, rec.left_out if rec else None
            ),
            training_order=done.order_digest,
            masks=done.mask_digest,
            selected=p.best,
            checkpoints=p.checkpoints,
            selected_checkpoint=p.selected_ckpt,
            graphs_captured=self.stepper.captured,
        )


def _recorder(cfg: RunConfig, telemetry: bool | None, splits: DataSplits, model) -> Recorder | None:
    if not (cfg.telemetry.enabled if telemetry is None else telemetry):
        return None
    from fathom.telemetry import Recorder as TelemetryRecorder

    sequence = model_kind(cfg.model.kind).tokens
    if sequence:
        from fathom.models.gpt import token_loss

        loss = token_loss()
    else:
        label = LabelLoss.of(cfg.loss)
        if label.target != "labels":  # the config refuses it; here too when telemetry=True
            raise FathomError(
                f"telemetry's probe instruments read the labels as the loss's targets, and "
                f"loss {cfg.loss.name!r} needs one-hot targets: train without telemetry"
            )
        loss = label.loss
    return TelemetryRecorder(
        cfg.telemetry,
        epochs=cfg.optim.epochs,
        splits=splits,
        model=model,
        seed=cfg.seed,
        loss=loss,
        sequence=sequence,
    )


def split_classes(splits: DataSplits, dataset: str) -> int:
    """The class count of the run's data: ``splits.info["classes"]`` (every data source sets
    it), else the registered ``dataset``'s when the examples have its size; refused
    otherwise (splits of other data without the count), never a guessed 10."""
    if splits.info.get("classes") is not None:
        return int(splits.info["classes"])
    what = 'the class count (splits.info["classes"])'
    classes, shape = registered_shape(dataset, what)
    if splits.fit_x[0].numel() != math.prod(shape):
        raise FathomError(
            f"{what} not given, and the examples ({list(splits.fit_x.shape[1:])}) are not "
            f"dataset {dataset!r}'s ({list(shape)}); set splits.info['classes'] from the data"
        )
    return classes


def _dataset_record(splits: DataSplits, cfg, base: str | None = None) -> Data:
    """The manifest's ``data`` section: files and their content hashes, split, the split
    tensors' digest (:func:`splits_digest`), sizes, shapes, and the directory the config's
    relative data paths are relative to (``info.paths_base``: ``base``, the one a resumed run
    recorded, else the working directory, :func:`fathom.data.paths.paths_base`)."""
    info = dict(splits.info)
    info["classes"] = split_classes(splits, cfg.data.dataset)
    info["in_features"] = int(splits.fit_x[0].numel())
    info["input_shape"] = [int(d) for d in splits.fit_x.shape[1:]]
    info["input_dtype"] = str(splits.fit_x.dtype).removeprefix("torch.")
    if (base := base or paths_base(cfg.data)) is not None:
        info["paths_base"] = base  # what the config's relative data paths are relative to
    return Data(
        dataset=cfg.data.dataset,
        files=info.pop("files", {}),
        split_mode=info.get("mode", cfg.data.split),
        split_seed=cfg.data.split_seed,
        split_hash=splits.split_hash,
        tensors_sha256=splits_digest(splits),
        sizes={
            "fit": int(splits.fit_y.shape[0]),
            "val": int(splits.val_y.shape[0]),
            "test": int(splits.test_y.shape[0]),
        },
        info=info,
    )


def _telemetry_record(
    clocks,
    enabled: bool,
    layers: list[dict[str, Any]] | None,
    schema_changes: list[dict[str, Any]] | None = None,
    left_out: dict[str, str] | None = None,
) -> Telemetry:
    """``total_s``, ``cold_s``, the overhead ratios telemetry clock / training clock
    (``tel / train`` and ``(tel - cold) / train``, ``None`` before any training time), the
    instrumented ``layers`` and the recorder's ``schema_changes`` (field-set changes) and the families an alias left out (``left_out``, ``None`` when none)."""
    tel, train = clocks.telemetry_s, clocks.training_s
    cold = clocks.telemetry_cold_s
    return Telemetry(
        enabled=enabled,
        total_s=tel,
        cold_s=cold,
        overhead_ratio=tel / train if train > 0 else None,
        overhead_ratio_without_cold=(tel - (cold or 0.0)) / train if train > 0 else None,
        layers=layers,
        schema_changes=schema_changes,
        families_left_out=left_out or None,
    )


def _new_manifest(
    s: Session, allocator_tuned: bool, note: str | None, phase: str | None
) -> RunManifest:
    """The run's manifest before its first boundary (:class:`fathom.rundir.RunManifest`)."""
    cfg, config_json = s.cfg, s.cfg.model_dump(mode="json")
    return RunManifest.model_validate(
        {
            "format": FORMAT,
            "kind": "run",
            "phase": phase,
            "run_id": s.run_dir.name,
            "study": cfg.study,
            "status": "running",
            "config": config_json,
            "config_hash": config_digest(config_json),
            "source_hash": source_hash(),
            "data": _dataset_record(s.splits, cfg, recorded_base(s.writer.recorded)),
            "model": {
                "kind": cfg.model.kind,
                "class": type(s.model).__name__,
                "parameters": count_parameters(s.model),
            },
            "hashes": {
                "initial_params": s.progress.initial_hash,
                "training_order": s.progress.order_digest,
                "masks": s.progress.mask_digest,
            },
            "environment": {**environment(s.device), "cpu_allocator_tuned": allocator_tuned},
            "epochs_completed": s.progress.epoch,
            "steps_completed": s.progress.step,
            "selected": s.progress.best,
            "checkpoints": s.progress.checkpoints,
            "selected_checkpoint": s.progress.selected_ckpt,
            "telemetry": {"enabled": s.recorder is not None},
            "live": cfg.live.model_dump(mode="json"),  # not in config / config_hash: never trains
            "execution": {
                "path": s.stepper.name,
                "precision": cfg.execution.precision,
                "note": note,
                "graph_limit_branches": cfg.execution.max_graph_branches,
            },
        }
    )


def build_session(
    cfg: RunConfig,
    writer: RunWriter,
    device: torch.device,
    splits: DataSplits | None,
    telemetry: bool | None,
    on_progress: OnProgress | None,
    t_invocation: float,
    phase: str | None = None,
) -> Session:
    """Every part of the run, seeded from ``cfg`` (see the module docstring for the order)."""
    allocator_tuned = tune_cpu_allocator() if device.type == "cpu" else False
    if splits is None:  # a resumed run's data is read where it was trained from
        data = (
            cfg.data
            if writer.recorded is None
            else run_data_config(writer.recorded, cfg.data, writer.path)
        )
        splits = prepare_splits(data, device)
    if splits.fit_y.shape[0] == 0:
        raise FathomError("the fitting split is empty; check data.fit_subset")
    shape = tuple(int(d) for d in splits.fit_x.shape[1:])
    model = init_model(
        cfg,
        split_classes(splits, cfg.data.dataset),
        int(splits.fit_x[0].numel()),
        shape,
        splits.fit_x[:2],
    )
    initial_hash = state_dict_digest(cpu_state(model))
    model.to(device)
    initial_params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    controller = build_controller(model, cfg)
    optimizer = build_optimizer(model, cfg.optim)
    shuffle_gen = torch.Generator().manual_seed(stream_seed(cfg.seed, "shuffle"))
    torch.manual_seed(stream_seed(cfg.seed, "dropout"))
    recorder = _recorder(cfg, telemetry, splits, model)
    stepper, note = make_stepper(cfg, model, optimizer, controller, splits, device)
    stepper.tick = step_ticker(on_progress, cfg.optim.epochs)
    s = Session(
        cfg,
        writer.path,
        device,
        splits,
        model,
        optimizer,
        controller,
        shuffle_gen,
        recorder,
        stepper,
        writer,
        initial_params,
        on_progress,
        t_invocation,
    )
    s.progress.initial_hash = initial_hash
    writer.prepare(_new_manifest(s, allocator_tuned, note, phase))
    return s
