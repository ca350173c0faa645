"""Config -> model, gate controller, optimizer, seeded generators."""

from __future__ import annotations

import hashlib

import torch

from fathom.config import OptimConfig, RunConfig
from fathom.config.recipes import recipe_spec
from fathom.depth import DropSchedule, GateController, find_branches
from fathom.errors import FathomError
from fathom.models import build_model
from fathom.models.ciresan import recipe_schedule


def stream_seed(seed: int, stream: str) -> int:
    """An independent 63-bit seed per named RNG stream: ``sha256(f"{seed}:{stream}")``."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{stream}".encode()).digest()[:8], "little") >> 1


def build_schedule(cfg: RunConfig) -> DropSchedule | None:
    """The recipe's drop schedule (``model.drop_probs`` overrides its probabilities).

    The Ciresan recipes carry one; a ``python`` model gets one from ``model.drop_probs``
    (and ``model.drop_schedule``) when given; a staged conv net has none.
    """
    if cfg.model.kind == "python":
        m = cfg.model
        if m.drop_probs is None or not any(m.drop_probs):
            return None
        end = float(cfg.optim.epochs) if m.drop_schedule == "linear_decrease" else None
        return DropSchedule(m.drop_schedule, tuple(m.drop_probs), end)
    if cfg.model.kind != "ciresan":
        return None
    spec = recipe_spec(cfg.model.recipe)
    if not spec.residual:
        return None
    schedule = recipe_schedule(spec, cfg.optim.epochs)
    if cfg.model.drop_probs is not None:
        kind = spec.schedule_kind if spec.schedule_kind != "none" else "constant"
        end = schedule.end_epoch if kind == "linear_decrease" else None
        schedule = DropSchedule(kind, tuple(cfg.model.drop_probs), end)
    if schedule.kind == "none" or not any(schedule.probs):
        return None
    return schedule


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
    return GateController(branches, schedule, seed=stream_seed(cfg.seed, "gates"))


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

    A user's model (``model.kind = "python"``) is checked on ``example`` (a few of the run's
    inputs) to return at least ``classes`` logits (:func:`fathom.models.factory.check_logits`).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(cfg.seed, "init"))
        model = build_model(
            cfg.model, classes, in_features, input_shape=input_shape, dataset=cfg.data.dataset
        )
    if cfg.model.kind == "python" and example is not None:
        from fathom.models.factory import check_logits

        check_logits(model, example.cpu(), classes, f"model.factory = {cfg.model.factory!r}")
    return model
