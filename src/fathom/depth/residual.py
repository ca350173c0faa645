"""The skippable residual module and its per-forward decision (:mod:`fathom.depth`).

``y = bypass(x) + gain * branch(x)``, the branch not called when ``gain == 0``; what
decides ``gain``, and the conventions: the :mod:`fathom.depth` docstring.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from fathom.errors import FathomError


def skippable_residual(
    x: torch.Tensor,
    branch: Callable[[torch.Tensor], torch.Tensor],
    bypass: Callable[[torch.Tensor], torch.Tensor],
    gain: float | torch.Tensor,
) -> torch.Tensor:
    """``bypass(x) + gain * branch(x)``, with ``branch`` not called when ``gain == 0``.

    ``gain`` is a Python float, or (CUDA-graph path, :mod:`fathom.train.fast`) a device
    scalar tensor of a *kept* branch whose value changes between graph replays; a tensor
    is never compared on the host. A kept branch with a gain other than one is
    ``bypass(x) + out * g`` with ``g`` the gain as a cached 0-d tensor (:func:`gain_tensor`:
    the same bits as the Python float, without its conversions). An in-place form
    (``out.mul_(g).add_(bypass(x))``, guarded against hooks) was bit-identical too but
    measured slower per step at width x 0.1 in 7 of 8 paired invocations and in 600-pair
    single-step A/Bs (docs/benchmarks-history.md#sd-quiet-rerun-089c6f1), so it was removed.
    """
    if isinstance(gain, torch.Tensor):
        skip = bypass(x)
        out = branch(x)
        if out.shape != skip.shape:
            _check_shapes(x, out, skip, branch, bypass)
        return skip + out * gain
    if gain == 0.0:
        return bypass(x)
    out = branch(x)
    skip = bypass(x)
    if out.shape != skip.shape:  # a bypass may broadcast; torch's error names no module
        _check_shapes(x, out, skip, branch, bypass)
    if gain == 1.0:
        return skip + out
    return skip + out * gain_tensor(gain, out)


def _check_shapes(x: torch.Tensor, out: torch.Tensor, skip: torch.Tensor, *modules) -> None:
    """Refuse a branch output that does not broadcast with its bypass's (the branch changes the
    width), naming ``modules`` (branch, bypass), the shapes and the fix (a projection shortcut)."""
    if all(i == j or 1 in (i, j) for i, j in zip(out.shape[::-1], skip.shape[::-1])):
        return  # a bypass that broadcasts is summed as torch sums it
    branch, bypass = (" ".join(repr(m).split())[:120] for m in modules)
    layer = {2: "nn.Linear({}, {})", 4: "nn.Conv2d({}, {}, 1)"}.get(x.dim(), "")
    example = f", e.g. bypass={layer.format(x.shape[1], out.shape[1])}" if layer else ""
    raise FathomError(
        f"SkippableResidual: its branch {branch} returns {list(out.shape)} but its bypass "
        f"{bypass} returns {list(skip.shape)} for an input of {list(x.shape)}; the two are added, "
        "so they must have one shape: keep the branch's output at the bypass's shape, or give a "
        f"bypass that maps the input to the branch's output (a projection shortcut{example})"
    )


_GAIN_TENSORS: dict[tuple[float, torch.dtype], torch.Tensor] = {}  # a schedule: a few per epoch
_GAIN_DTYPES, _GAIN_CACHE_SIZE = (torch.float32, torch.float64), 256


def gain_tensor(gain: float, out: torch.Tensor) -> float | torch.Tensor:
    """``gain`` as ``out``'s multiplier: a cached 0-d tensor of ``out``'s dtype (CPU
    float32/float64 ``out``), else ``gain`` itself.

    ``out * gain`` wraps a Python float as a float64 scalar that the kernel converts to
    ``out``'s dtype (``aten::to``, ``_to_copy``, ``empty_strided``, ``copy_``), in the forward
    and again in ``MulBackward0``; the 0-d tensor holds ``dtype(gain)``, the one rounding that
    conversion makes, so the products are bit-identical (``tests/test_sd_dispatch.py``).
    Reduced precisions (their kernels read a float32 scalar) and other devices keep the
    float. The tensor is never written (autograd saves it) nor an inference tensor.
    """
    dtype = out.dtype
    if dtype not in _GAIN_DTYPES or out.device.type != "cpu":
        return gain
    key = (gain, dtype)
    t = _GAIN_TENSORS.get(key)
    if t is None:
        if len(_GAIN_TENSORS) >= _GAIN_CACHE_SIZE:
            _GAIN_TENSORS.clear()
        with torch.inference_mode(False):
            t = _GAIN_TENSORS[key] = torch.tensor(gain, dtype=dtype)
    return t


class Crop(nn.Module):
    """Keep the first ``features`` coordinates of the last dimension (a zero-parameter bypass)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., : self.features]

    def extra_repr(self) -> str:
        return f"features={self.features}"


def _real_scalar(p: object) -> float | None:
    """The value of a real scalar ``p`` as a Python float, or None if ``p`` is not one.

    Accepted: ``int``/``float`` (and ``numbers.Real``), numpy real scalars and 0-d arrays
    (``np.float32(0.2)`` is the float ``0.2000000029802...``, its exact value), and 0-d
    real torch tensors on any device (read with ``.item()``). Refused: booleans of every
    kind, complex numbers, strings, anything with a dimension (``[0.2]``, ``tensor([0.2])``).
    """
    if isinstance(p, torch.Tensor):
        if p.dim() != 0 or p.dtype == torch.bool or p.is_complex() or p.is_meta:
            return None
        return float(p.detach().item())
    if isinstance(p, (bool, np.bool_)):
        return None
    if isinstance(p, np.ndarray):
        if p.ndim != 0 or p.dtype.kind not in "iuf":
            return None
        return float(p)
    if isinstance(p, (numbers.Real, np.integer, np.floating)):
        return float(p)
    return None


def check_drop_prob(p: object, where: str = "SkippableResidual") -> float:
    """``p`` as a Python float in ``[0, 1)``, or a FathomError naming the problem and the fix.

    ``p`` is any real scalar (:func:`_real_scalar`: Python, numpy or 0-d torch); NaN and
    values outside ``[0, 1)`` are refused, and so are non-scalars and booleans.
    """
    value = _real_scalar(p)
    if value is None:
        raise FathomError(
            f"drop probability {p!r} of {where} is not a real scalar (got "
            f"{type(p).__name__}): give one number in [0, 1) per branch, e.g. 0.2, "
            "np.float32(0.2) or torch.tensor(0.2)"
        )
    if not 0.0 <= value < 1.0:
        raise FathomError(
            f"drop probability {p!r} of {where} is outside [0, 1): p = 1 would drop the branch "
            "on every step and leave no survival gain 1/(1-p); delete a branch with "
            "fathom.depth.branch_mask(model, mask) instead"
        )
    return value


CONVENTIONS = ("inverse", "huang")
"""How a branch's output is scaled (:mod:`fathom.depth`, ``depth.convention`` of a run):
``inverse`` (the default) scales kept branches by ``1/(1-p)`` in training and by one at
evaluation; ``huang`` (Huang et al. 2016) leaves them unscaled in training and weights them
by their survival ``1-p`` at evaluation and under masks."""


def check_convention(convention: str) -> str:
    """``convention`` if it is one of :data:`CONVENTIONS`, else a FathomError naming them."""
    if convention not in CONVENTIONS:
        raise FathomError(
            f"unknown stochastic-depth convention {convention!r}; use one of {', '.join(CONVENTIONS)}"
        )
    return convention


def survival_gain(kept: bool, p: float, convention: str = "inverse") -> float:
    """The training gain of one decision: ``kept / (1 - p)`` (``inverse``) or ``kept``
    (``huang``: a survivor unscaled); ``0.0`` when dropped."""
    if not kept:
        return 0.0
    return 1.0 if convention == "huang" else 1.0 / (1.0 - p)


def evaluation_gain(p: float, convention: str = "inverse") -> float:
    """The gain of a branch that is not drawn (``eval()``, or kept by a mask): ``1`` for
    ``inverse``, the survival ``1 - p`` for ``huang`` (its expectation in training)."""
    return 1.0 - p if convention == "huang" else 1.0


COMPILE_BREAK_REASON = (
    "fathom.depth.SkippableResidual draws its stochastic-depth decision on the host (a graph "
    "break); compile without fullgraph=True, or set module.gain (or p = 0) to compile it whole"
)


def _uniform(generator: torch.Generator) -> float:
    """``u ~ U[0, 1)`` in float64 from ``generator``, read on the host."""
    return torch.rand((), generator=generator, dtype=torch.float64).item()


def _seed_from_global() -> int:
    """A seed ``s ~ U{0, ..., 2^62 - 1}`` drawn from torch's global CPU generator, on the host."""
    return int(torch.randint(0, 2**62, ()).item())


T = TypeVar("T")
_OUTSIDE_COMPILE: dict[Callable[..., object], Callable[..., object]] = {}


def _outside_compile(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` run outside tracing, called only while ``torch.compile`` traces.

    The :func:`torch.compiler.disable` wrapper is made at the first trace, not at import:
    making it imports ``torch._dynamo`` (1.2 s of CPU), which eager users and every command
    that never compiles would pay. The first trace breaks the graph itself with
    :data:`COMPILE_BREAK_REASON` (``fullgraph=True`` quotes it), then makes the wrapper
    outside tracing (``disable`` is not traced: a second break, run eagerly); later traces
    find it made.
    """
    disabled = _OUTSIDE_COMPILE.get(fn)
    if disabled is None:
        import torch._dynamo

        torch._dynamo.graph_break(msg=COMPILE_BREAK_REASON)
        disabled = torch.compiler.disable(fn, reason=COMPILE_BREAK_REASON)
        _OUTSIDE_COMPILE[fn] = disabled
    return disabled(*args)  # type: ignore[return-value]


def _seed_generator() -> torch.Generator:
    """A CPU generator seeded by :func:`_seed_from_global` (outside tracing when compiling).

    The first draw of a module built with ``seed=None`` calls it, so a compiled module
    consumes torch's global generator exactly as the eager one does.
    """
    if torch.compiler.is_compiling():
        # traced, the randint would be lowered by the compiler's own RNG (inductor draws from
        # its own seeds), so a compiled module would seed differently than the eager one
        return torch.Generator().manual_seed(_outside_compile(_seed_from_global))
    return torch.Generator().manual_seed(_seed_from_global())


def draw_kept(generator: torch.Generator, p: float) -> bool:
    """One host-side Bernoulli decision ``kept = [u >= p]``, ``u ~ U[0, 1)`` in float64.

    The same rule as :meth:`GateController.draw`. Under ``torch.compile`` the draw runs in a
    function excluded from tracing (a graph break), so a compiled model decides exactly as
    the eager one; eagerly it is called directly (the exclusion wrapper costs more than the
    draw). Refused inside CUDA-graph capture, where the decision would be frozen.
    """
    if torch.compiler.is_compiling():
        return _outside_compile(_uniform, generator) >= p
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        raise FathomError(
            "a self-sampling SkippableResidual (p > 0, no gain set) cannot be captured in a "
            "CUDA graph: its host-side draw would be frozen at capture; draw the gates ahead "
            "and set module.gain per topology, as fathom.train.fast does"
        )
    return _uniform(generator) >= p


class SkippableResidual(nn.Module):
    """``y = bypass(x) + gain * branch(x)``; ``gain == 0`` skips the branch entirely.

    ``p``: drop probability of the module's own decisions in ``train()`` (``[0, 1)``,
    settable at any time, e.g. per epoch). ``convention``: how a branch is scaled
    (:data:`CONVENTIONS`; ``"huang"`` weights it by ``1 - p`` in ``eval()`` and under a
    mask, and leaves a kept branch unscaled in its own draws). ``seed``: seeds its generator; ``None`` seeds it
    at its first draw from torch's global generator (so ``torch.manual_seed`` makes a run
    reproducible and distinct branches draw independently). ``gain`` (``None`` unless set
    from outside) and ``mask`` (``None`` unless set by :func:`branch_mask`) override the
    draw as the module docstring orders them.
    """

    def __init__(
        self,
        branch: nn.Module,
        bypass: nn.Module | None = None,
        p: float = 0.0,
        *,
        seed: int | None = None,
        convention: str = "inverse",
    ) -> None:
        super().__init__()
        self.branch = branch
        self.bypass = bypass if bypass is not None else nn.Identity()
        self.p = p
        self.convention = check_convention(convention)
        self.gain: float | torch.Tensor | None = None
        self.mask: bool | None = None
        self.generator: torch.Generator | None = None
        if seed is not None:
            self.generator = torch.Generator().manual_seed(int(seed))

    @property
    def p(self) -> float:
        return self._p

    @p.setter
    def p(self, value: float) -> None:
        self._p = check_drop_prob(value)

    def decide(self) -> float | torch.Tensor:
        """This forward's gain (module docstring: mask, eval, outside gain, own draw)."""
        if self.mask is not None:
            return evaluation_gain(self._p, self.convention) if self.mask else 0.0
        if not self.training:
            return evaluation_gain(self._p, self.convention)
        if self.gain is not None:
            return self.gain
        if self._p == 0.0:
            return 1.0
        return survival_gain(draw_kept(self._generator(), self._p), self._p, self.convention)

    def _generator(self) -> torch.Generator:
        if self.generator is None:
            self.generator = _seed_generator()
        return self.generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return skippable_residual(x, self.branch, self.bypass, self.decide())

    # -- state: the generator travels in state_dict() as "<prefix>_extra_state" ----------
    def get_extra_state(self) -> torch.Tensor:
        """The generator state (``uint8``; empty while not yet seeded)."""
        if self.generator is None:
            return torch.empty(0, dtype=torch.uint8)
        return self.generator.get_state()

    def set_extra_state(self, state: torch.Tensor) -> None:
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise FathomError(
                "SkippableResidual extra state must be the uint8 generator state written by "
                f"state_dict(), got {type(state).__name__}"
            )
        if state.numel() == 0:
            self.generator = None
            return
        self.generator = torch.Generator()
        self.generator.set_state(state.detach().cpu().clone())

    def extra_repr(self) -> str:
        parts = [f"p={self._p:g}"]
        if self.convention != "inverse":
            parts.append(f"convention={self.convention}")
        if self.gain is not None:
            parts.append(f"gain={self.gain}")
        if self.mask is not None:
            parts.append(f"mask={int(self.mask)}")
        return ", ".join(parts)


def set_gain(module: SkippableResidual, gain: float | torch.Tensor | None) -> None:
    """``module.gain = gain``, past ``nn.Module.__setattr__`` where that stores the same thing.

    For a ``SkippableResidual`` itself (a subclass may define ``gain`` otherwise) holding the
    plain ``gain`` attribute of ``__init__``, and a float or ``None``, ``__setattr__`` only
    checks the value's type and the three registries, then stores it in ``__dict__``;
    stored directly, ~15 Python calls per branch and step fewer. Else ``setattr``.
    """
    d = module.__dict__
    if type(module) is SkippableResidual and "gain" in d and (gain is None or type(gain) is float):
        d["gain"] = gain
    else:
        module.gain = gain


def find_branches(model: nn.Module) -> list[SkippableResidual]:
    """All skippable branches of ``model`` in registration (shallow-to-deep) order."""
    return [m for m in model.modules() if isinstance(m, SkippableResidual)]
