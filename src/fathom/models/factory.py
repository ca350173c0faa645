"""A user's model from ``model.factory = "package.module:function"`` (:mod:`fathom.base.user_code`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fathom.base.user_code import call_factory
from fathom.config.models import PythonModelConfig
from fathom.depth import DropSchedule
from fathom.errors import FathomError
from fathom.losses.kinds import CrossEntropy
from fathom.losses.layout import read_output
from fathom.models.specs import DataShape


def _build_python_model(path: str, kwargs: dict[str, Any]) -> nn.Module:
    """A user's ``nn.Module`` from its factory (``model.kind = "python"``)."""
    model = call_factory(path, kwargs, "model.factory")
    if not isinstance(model, nn.Module):
        raise FathomError(
            f"model.factory = {path!r} returned a {type(model).__name__}, not a torch.nn.Module; "
            "return the module itself (not a class, a tuple or a state dict)"
        )
    if not any(True for _ in model.parameters()):
        raise FathomError(f"model.factory = {path!r} returned a module without parameters")
    return model


def check_logits(model: nn.Module, example: torch.Tensor, classes: int, origin: str) -> None:
    """Refuse a model whose output cannot score ``classes`` labels: one forward of ``example``
    (a couple of the run's own inputs) in ``eval()``, without gradients, under a forked RNG;
    every module's train/eval flag is restored. The output must be ``[n, k]`` logits
    (:func:`fathom.losses.read_output`, the one layout checker) with ``k >= classes``
    (cross entropy indexes logit ``y`` of every label ``y < classes``)."""
    flags = {m: m.training for m in model.modules()}
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            out = model.eval()(example)
    except Exception as e:  # the user's forward failing on the data is their bad input
        raise FathomError(
            f"{origin}: the model's forward fails on the data's inputs (shape "
            f"{list(example.shape[1:])}, dtype {example.dtype}): {type(e).__name__}: {e}"
        ) from None
    finally:
        for m, flag in flags.items():
            m.training = flag
    if isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[1] < classes:
        raise FathomError(
            f"{origin}: the model returns {out.shape[1]} logits per example but the data's labels "
            f"run to {classes - 1} ({classes} classes); give the model {classes} outputs, or "
            "relabel the data to fewer classes"
        )
    try:
        read_output(out, example.shape[0], CrossEntropy())  # the one layout checker
    except FathomError as e:
        raise FathomError(f"{origin}: {e}") from None


def build(cfg: PythonModelConfig, shape: DataShape) -> nn.Module:
    """The ``python`` kind's builder (:mod:`fathom.config.model_kinds`): the factory shapes
    the model itself."""
    return _build_python_model(cfg.factory, dict(cfg.kwargs))


def drop_schedule(cfg: PythonModelConfig, epochs: int) -> DropSchedule | None:
    """``model.drop_probs`` under ``model.drop_schedule`` (``linear_decrease`` reaches 0 at
    the last epoch ``E``); ``None`` when not given or all zero (branches draw by their own
    ``p``)."""
    if cfg.drop_probs is None or not any(cfg.drop_probs):
        return None
    end = float(epochs) if cfg.drop_schedule == "linear_decrease" else None
    return DropSchedule(cfg.drop_schedule, tuple(cfg.drop_probs), end)
