"""What a resume restores: clocks, bookkeeping, RNG states, and the resume file itself.

``checkpoints/resume.safetensors`` holds the model, optimizer, gate controller, stepper and
recorder states, every RNG (shuffle generator, torch CPU / CUDA), the clocks and the
bookkeeping below, written at epoch boundaries; a resumed run continues byte-identically.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch


@dataclass
class Clocks:
    """Seconds; the training clock counts optimizer steps only (DESIGN.md, Clocks).

    ``training_s`` is wall time of the optimizer steps; ``training_cpu_s`` the training
    thread's CPU time of the same steps (``time.thread_time``, :func:`fathom.train.steppers.
    run_timed`), the clock other jobs on a shared machine disturb least.
    """

    training_s: float = 0.0
    training_cpu_s: float = 0.0
    evaluation_s: float = 0.0
    telemetry_s: float = 0.0
    telemetry_cold_s: float | None = None
    checkpoint_s: float = 0.0
    elapsed_s: float = 0.0


def chain(prev: str, payload: bytes) -> str:
    """``sha256(prev || payload)``: the running digests of training order and masks."""
    return hashlib.sha256(prev.encode() + payload).hexdigest()


GENESIS = hashlib.sha256(b"fathom").hexdigest()


@dataclass
class Progress:
    """Bookkeeping carried across epochs (and across a resume)."""

    epoch: int = 0
    step: int = 0
    order_digest: str = GENESIS
    mask_digest: str = GENESIS
    best: dict[str, Any] = field(default_factory=lambda: {"epoch": None, "val_ce": None})
    checkpoints: dict[str, Any] = field(default_factory=dict)
    selected_ckpt: dict[str, Any] | None = None
    initial_hash: str | None = None
    clocks: Clocks = field(default_factory=Clocks)

    def to_state(self) -> dict[str, Any]:
        out = asdict(self)
        out["clocks"] = asdict(self.clocks)
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Progress:
        return cls(**{**state, "clocks": Clocks(**state["clocks"])})


PROGRESS_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Progress))


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["torch_cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch_cpu"])
    if device.type == "cuda" and "torch_cuda" in state:
        torch.cuda.set_rng_state(state["torch_cuda"], device)
