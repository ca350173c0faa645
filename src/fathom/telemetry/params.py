"""Parameter-space summaries: norms, displacement, momentum buffers, update-to-weight ratios.

All norms are Frobenius norms computed in float64. These read parameters and optimizer
state only; nothing is written. The functions are one-shot forms of :class:`Norms`, which
an observation uses to convert each tensor to float64 and take each norm once.
"""

from __future__ import annotations

import torch

REFERENCE_ELEMENTS = 2**24  # float64 reference copies kept across observations (128 MiB)


def frob(t: torch.Tensor | None) -> float | None:
    """``||t||_F`` in float64, ``None`` for a missing tensor."""
    return Norms().frob(t)


def displacement(w: torch.Tensor, w0: torch.Tensor) -> float:
    """``||W - W_0||_F`` (distance travelled from the initial parameters)."""
    return Norms().displacement(w, w0)


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``; ``None`` if either is missing or the denominator is zero."""
    if num is None or den is None or den == 0.0:
        return None
    return num / den


def sgd_last_update_norm(
    param: torch.Tensor, optimizer: torch.optim.Optimizer, lr: float | None = None
) -> float | None:
    """``lr * ||buf||_F``: the size of the last SGD update of ``param`` (:meth:`Norms.sgd_last_update_norm`)."""
    return Norms().sgd_last_update_norm(param, optimizer, lr)


def momentum_norm(param: torch.Tensor, optimizer: torch.optim.Optimizer) -> float | None:
    """``||buf||_F`` of the SGD momentum buffer of ``param`` (``None`` if there is none)."""
    return Norms().momentum_norm(param, optimizer)


class Norms:
    """The norms of one observation, each taken once (a weight's norm serves its layer's
    weight norm and update ratio, a momentum buffer's norm its momentum and update norms, a
    displacement its layer's and the model's joint displacement). Valid while the tensors
    are not changed in place: create one per observation.

    Each tensor is copied to float64 into one of two scratch buffers kept across
    observations (``scratch``; a fresh multi-megabyte buffer per tensor costs more in page
    faults than the arithmetic), its norm taken there, and ``W - W_0`` formed in place:
    the same float64 entries reduced in the same order as ``t.to(float64)``, the same bits.
    """

    def __init__(self, scratch: dict | None = None) -> None:
        self._norms: dict[tuple[int, ...], float] = {}
        self._held: list[torch.Tensor] = []  # every keyed tensor: its id cannot be reused
        self._scratch = {} if scratch is None else scratch
        # reference norms of the last observation; only those asked for again are kept
        self._old_references = self._scratch.pop("references", {})
        self._scratch["references"] = {}
        # float64 copies of displacement references, kept across observations like their
        # norms (while the same object at the same version), within REFERENCE_ELEMENTS
        self._old_copies = self._scratch.pop("reference_copies", {})
        self._scratch["reference_copies"] = {}
        self._kept = 0  # entries of the float64 reference copies kept by this observation
        self._slots: list[tuple | None] = [None, None]  # (tensor, version) a slot holds

    def frob(self, t: torch.Tensor | None, *, reference: bool = False) -> float | None:
        """``||t||_F`` in float64, ``None`` for a missing tensor. ``reference``: a tensor
        that rarely changes (a displacement reference ``W_0``): its norm is kept across
        observations while it is the same object at the same in-place version."""
        if t is None:
            return None
        if reference:
            held = self._scratch["references"].get(id(t)) or self._old_references.get(id(t))
            if held is None or held[0] is not t or held[1] != t._version:
                held = (t, t._version, self.frob(t))
            self._scratch["references"][id(t)] = held
            return held[2]
        if (id(t),) not in self._norms:
            self._load(t, 0)
        return self._norms[(id(t),)]

    def displacement(self, w: torch.Tensor, w0: torch.Tensor) -> float:
        """``||W - W_0||_F`` (distance travelled from the initial parameters), in float64:
        ``W`` copied to float64, then ``W_0`` subtracted in place (a float32 ``W_0`` is cast
        to float64 entry by entry inside the kernel, exactly as a float64 copy would be)."""
        key = (id(w), id(w0))
        if key not in self._norms:
            a = self._load(w, 0)  # (no copy when the slot still holds w: its norm was just taken)
            ref = w0.detach().to(w.device)
            if ref.is_complex() or a.is_complex():
                ref = self._load(w0, 1, w.device)
            elif ref.dtype != torch.float64:
                ref = self._reference64(w0, ref)
            self._norms[key] = float(torch.linalg.vector_norm(a.sub_(ref)))
            self._slots[0] = None  # it now holds W - W_0
            self._held += [w, w0]
        return self._norms[key]

    def _reference64(self, w0: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """``ref`` (``w0`` on the device) in float64, copied once and kept across
        observations while ``w0`` is the same object at the same in-place version (the
        float32 -> float64 conversion is exact: the difference below has the bits of a
        subtraction that converts inside the kernel). Beyond :data:`REFERENCE_ELEMENTS`
        kept entries the conversion happens inside the subtraction, as before."""
        kept = self._scratch["reference_copies"]
        held = kept.get(id(w0)) or self._old_copies.get(id(w0))
        if held is None or held[0] is not w0 or held[1] != w0._version:
            fits = self._kept + ref.numel() <= REFERENCE_ELEMENTS and ref.is_floating_point()
            held = (w0, w0._version, ref.to(torch.float64) if fits else None)
        if held[2] is None or held[2].device != ref.device:
            return ref
        if id(w0) not in kept:
            kept[id(w0)] = held
            self._kept += held[2].numel()  # (a running count: no sum over the kept copies)
        return held[2]

    def _load(self, t: torch.Tensor, slot: int, device: torch.device | None = None):
        """``t`` in float64 (in scratch buffer ``slot`` on ``device``, default ``t``'s), its
        norm recorded."""
        d = t.detach()
        if d.is_complex():  # not a real tensor: float64 keeps the real part, as .to() does
            t64 = d.to(device or d.device, torch.float64)
        else:
            t64 = self._buffer(device or d.device, d.numel(), slot)
            t64 = t64[: d.numel()].view(d.shape)
            here = device in (None, d.device)
            held = self._slots[slot]
            if not here or held is None or held[0] is not t or held[1] != t._version:
                t64.copy_(d)  # (a slot still holding t's copy, unchanged since, is reused)
                self._slots[slot] = (t, t._version) if here else None
        if (id(t),) not in self._norms:
            self._norms[(id(t),)] = float(torch.linalg.vector_norm(t64))
            self._held.append(t)
        return t64

    def _buffer(self, device: torch.device, n: int, slot: int) -> torch.Tensor:
        held = self._scratch.setdefault(("buffers", device), [None, None])
        if held[slot] is None or held[slot].numel() < n:
            held[slot] = torch.empty(n, dtype=torch.float64, device=device)
        return held[slot]

    def momentum_norm(self, param: torch.Tensor, optimizer: torch.optim.Optimizer) -> float | None:
        """``||buf||_F`` of the SGD momentum buffer of ``param`` (``None`` if there is none)."""
        return self.frob(optimizer.state.get(param, {}).get("momentum_buffer"))

    def sgd_last_update_norm(
        self, param: torch.Tensor, optimizer: torch.optim.Optimizer, lr: float | None = None
    ) -> float | None:
        """``lr * ||buf||_F``: the size of the last SGD update of ``param``.

        ``lr``: the rate that update applied (the trainer passes its plan's,
        ``EpochContext.lr``); ``None`` reads the group's ``param_group["lr"]``, which a loop
        driving torch's optimizer and schedulers keeps current.

        For ``torch.optim.SGD`` with momentum ``mu > 0``, dampening 0 and no Nesterov, a step
        is ``buf <- mu buf + (g + wd W); W <- W - lr buf``, so ``lr * buf`` *is* the last
        update applied. ``None`` when the parameter has no momentum buffer (no step yet,
        momentum 0, another optimizer) or the group uses Nesterov or dampening (the update is
        not ``lr buf``). A branch skipped by stochastic depth keeps the buffer of the last
        step that computed it.
        """
        buf = optimizer.state.get(param, {}).get("momentum_buffer")
        if buf is None:
            return None
        for group in optimizer.param_groups:
            if any(p is param for p in group["params"]):
                if group.get("nesterov", False) or group.get("dampening", 0.0) != 0.0:
                    return None
                rate = group["lr"] if lr is None else lr
                return float(rate) * float(self.frob(buf))
        return None
