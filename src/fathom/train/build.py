"""Config -> model, gate controller, optimizer, seeded generators."""

from __future__ import annotations

import hashlib

import torch

from fathom.config import OptimConfig, RunConfig
from fathom.config.model_kinds import model_kind
from fathom.depth import DropSchedule, GateController, find_branches
from fathom.errors import FathomError
from fathom.models import build_model, drop_schedule


def stream_seed(seed: int, stream: str) -> int:
    """An independent 63-bit seed per named RNG stream: ``sha256(f"{seed}:{stream}")``."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{stream}".encode()).digest()[:8], "little") >> 1


def build_schedule(cfg: RunConfig) -> DropSchedule | None:
    """The model kind's drop schedule (its row's ``drop_schedule``), ``None`` for none.

    The Ciresan recipes carry one (``model.drop_probs`` overrides its probabilities); a
    ``python`` model gets one from ``model.drop_probs`` (and ``model.drop_schedule``) when
    given; a staged conv net has none.
    """
    return drop_schedule(cfg.model, cfg.optim.epochs)


def build_controller(model: torch.nn.Module, cfg: RunConfig) -> GateController | None:
    schedule = build_schedule(cfg)
    if schedule is None:
        return None
    branches = find_branches(model)
    if len(branches) != len(schedule.probs):
        raise FathomError(
            f"model.drop_probs gives {len(schedule.probs)} probabilities but the model has "
            f"{len(branches)} SkippableResidual branches; give one per branch, in module order"
        )
    return GateController(
        branches, schedule, seed=stream_seed(cfg.seed, "gates"), convention=cfg.depth.convention
    )


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """SGD with momentum (optionally Nesterov) or AdamW; ``impl`` picks torch's for-loop,
    foreach or fused kernel.

    Skipped branches get ``grad is None`` (``zero_grad(set_to_none=True)``), which every
    implementation skips: for SGD no momentum and no weight decay on that step; for AdamW
    no first or second moment update, no step-count increment (torch keeps one ``step``
    per parameter) and no decoupled decay.
    """
    kwargs: dict = {"foreach": False}
    if cfg.impl == "foreach":
        kwargs = {"foreach": True}
    elif cfg.impl == "fused":
        kwargs = {"fused": True}
    if cfg.name == "adamw":
        return torch.optim.AdamW(
            model.parameters(),
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            **kwargs,
        )
    opt = torch.optim.SGD(
        model.parameters(),
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        weight_decay=cfg.weight_decay,
        **kwargs,
    )
    if cfg.impl == "fused":
        init_momentum_buffers(opt)
    return opt


def init_momentum_buffers(opt: torch.optim.SGD) -> None:
    """Give every parameter a zero momentum buffer up front.

    ``b = momentum * 0 + d`` equals torch's first-step rule ``b = d``, so nothing changes
    numerically; it is needed because torch's *fused* SGD treats a step as "first" only
    when *no* parameter has a buffer, and fails (``expected Tensor ... got NoneType``) when a
    parameter first receives a gradient later — exactly what happens to a branch that
    stochastic depth skipped on the first step.
    """
    for group in opt.param_groups:
        if not group["momentum"]:
            continue
        for p in group["params"]:
            state = opt.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def init_model(
    cfg: RunConfig,
    classes: int | None = None,
    in_features: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    example: torch.Tensor | None = None,
) -> torch.nn.Module:
    """Build the model with the run's seeded initialisation (on the CPU).

    ``classes``, ``in_features`` and ``input_shape`` are the data's (the trainer passes its
    splits'); one not given is ``cfg.data.dataset``'s when that is a registered dataset, and
    refused otherwise (:func:`fathom.models.build_model`).

    A model built by a user's factory (``model.kind = "python"``) is checked on ``example`` (a few of the run's
    inputs) to return at least ``classes`` logits (:func:`fathom.models.factory.check_logits`).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(cfg.seed, "init"))
        model = build_model(
            cfg.model, classes, in_features, input_shape=input_shape, dataset=cfg.data.dataset
        )
    key = model_kind(cfg.model.kind).factory
    if key is not None and example is not None:
        from fathom.models.factory import check_logits

        origin = f"model.{key} = {getattr(cfg.model, key)!r}"
        check_logits(model, example.cpu(), classes, origin)
    if cfg.depth.convention != "inverse":  # every branch, those drawing their own gates too
        from fathom.models import set_depth_convention

        set_depth_convention(model, cfg.depth.convention)
    return model
