"""The losses an output meets its target with, in closed form, and their one normalization.

**Normalization, written once.** On an output ``z`` read as ``[N, P, C]``
(:mod:`fathom.losses.layout`: ``N`` examples, ``P`` positions each, ``C`` classes or one
entry), the reduced loss is

    L = sum_i sum_p w_ip l(z_ip, y_ip),      w_ip = s m_ip,

``m_ip`` one for a valid position and zero for an ignored one (``ignore_index``), and ``s``
the reduction's scalar: ``1 / M`` for ``reduction="mean"`` (``M`` the number of valid
positions as torch counts them: valid labels for integer cross-entropy targets, ``N P`` for
probability targets, ``N E`` entries for MSE and BCE), ``1`` for ``"sum"``. ``L`` equals the
``torch.nn.functional`` loss of the same name and options, value and gradient.

Per example ``i`` and position ``p`` every loss gives, in closed form (float64):

* the value ``l_ip`` (:meth:`Loss.values`);
* the residual ``dl_ip / dz_ip`` (:meth:`Loss.gradient`), so ``dL/dz_ip = w_ip dl_ip/dz_ip``;
* a square-root factor ``F_ip [C, K]`` of its output Hessian, ``d^2 l_ip / dz_ip^2 = F_ip F_ip^T``
  (:meth:`Loss.hessian_sqrt`).

The three losses (:data:`LOSSES`; the definitions text is :data:`LOSS_DEFINITIONS`):

* ``cross_entropy`` (``ignore_index=-100``, ``label_smoothing=eps``, ``class_dim``): integer
  targets ``y`` (``[N, *positions]``) or probability targets ``t`` (the output's shape); with
  ``t'_c = (1 - eps) t_c + eps / C`` (``t = e_y`` for an integer label)
  ``l = -sum_c t'_c log p_c``, ``p = softmax(z)``; ``dl/dz = (sum_c t'_c) p - t'``;
  Hessian ``(sum_c t'_c) (diag p - p p^T)`` with the reduced rank ``C - 1`` factor
  ``sqrt(sum_c t'_c) R`` (:func:`fathom.losses.softmax.softmax_hessian_sqrt_reduced`: one
  direction fewer than classes); ``sum_c t'_c = 1`` for integer labels and distributions;
* ``mse``: ``l = (z - t)^2`` per entry, ``dl/dz = 2 (z - t)``, Hessian ``2``, factor
  ``sqrt(2)`` (torch's ``mse_loss`` has no ``1/2``: curvlinops' and BackPACK's
  ``sqrt(2 c) I`` convention, ``c`` their reduction factor, here inside ``w``);
* ``bce_with_logits`` (multi-label): ``l = softplus(z) - t z`` per entry, ``dl/dz = sigma(z) - t``,
  Hessian ``sigma(z) (1 - sigma(z))``, factor ``sqrt(sigma(z) sigma(-z))`` (no cancellation).

**Output directions.** :meth:`Terms.directions` gives the exact GGN directions
``[D, N, *out]`` (``D = P K``; direction ``(p, k)`` of example ``i`` is
``sqrt(w_ip) F_ip[:, k]`` at position ``p`` and zero elsewhere), so that
``sum_d (J_i^T v_di)(J_i^T v_di)^T = sum_p w_ip J_ip^T H_ip J_ip`` and the GGN of ``L`` is their
sum over examples. The sampled estimators (:mod:`fathom.curvature.estimate`) draw output
directions from the same :class:`Terms` (weights, mask, canonical view) with the same
contract in expectation, ``E[v_i v_i^T] = sum_p w_ip H_ip`` for every example ``i``, and
apply ``sum_p w_ip H_ip`` to a vector in closed form (Hutchinson).
"""

from __future__ import annotations

import difflib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from fathom.errors import FathomError
from fathom.losses.layout import Layout
from fathom.losses.softmax import softmax_hessian_sqrt_reduced, softmax_parts

Reduction = Literal["mean", "sum"]
_REDUCTIONS: tuple[str, ...] = ("mean", "sum")


@dataclass(frozen=True)
class Loss(ABC):
    """A loss with its options; subclasses fill the closed forms (module docstring)."""

    name: ClassVar[str]
    reduction: Reduction = "mean"

    def __post_init__(self) -> None:
        if self.reduction not in _REDUCTIONS:
            raise FathomError(
                f"{self.name}: reduction={self.reduction!r} is not one of {list(_REDUCTIONS)}"
                f"{_did_you_mean(str(self.reduction), _REDUCTIONS)}"
            )

    # -- the layout and the target --------------------------------------------------------
    def layout(self, shape: tuple[int, ...]) -> Layout:
        """How an output of ``shape`` is read; elementwise by default (every entry alone)."""
        if len(shape) < 1:
            raise FathomError(f"{self.name}: the output needs a leading example dimension")
        return Layout(tuple(shape), None)

    def canon_target(self, layout: Layout, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(target [N, P, C], valid mask [N, P])``: a floating target of the output's shape."""
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != layout.shape:
            got = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise FathomError(
                f"{self.name}: the target must have the output's shape {list(layout.shape)}, "
                f"got {got}; pass one target value per output entry"
            )
        if not y.is_floating_point():
            raise FathomError(
                f"{self.name}: the target is {y.dtype}; it must be floating point "
                "(convert it with y.float())"
            )
        if not bool(torch.isfinite(y).all()):
            raise FathomError(f"{self.name}: the target holds NaN or infinite values")
        t = layout.canon(y.to(torch.float64))
        return t, torch.ones(t.shape[:2], dtype=torch.bool, device=y.device)

    def terms(self, output: torch.Tensor | tuple[int, ...], target: torch.Tensor) -> Terms:
        """This loss read on ``output`` (a tensor or its shape) against ``target``: the
        canonical target, the valid positions and the normalization (module docstring)."""
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else tuple(output)
        layout = self.layout(shape)
        t, mask = self.canon_target(layout, target)
        valid = int(mask.sum())
        if valid == 0:
            raise FathomError(
                f"{self.name}: every position of the target is masked (ignore_index), so the "
                "loss has no term and no curvature; pass targets with at least one valid label"
            )
        n = layout.n
        weight = Fraction(1, valid) if self.reduction == "mean" else Fraction(1)
        scale = Fraction(1, n) if self.reduction == "mean" else Fraction(1)
        return Terms(self, layout, t, mask, weight, scale)

    # -- closed forms over canonical [N, P, C] ---------------------------------------------
    @abstractmethod
    def values(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The per-position loss values ``l_ip`` (module docstring)."""

    @abstractmethod
    def gradient(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The per-position residual ``dl_ip/dz_ip`` (module docstring)."""

    @abstractmethod
    def hessian_sqrt(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The per-position factor ``S_ip`` of the output Hessian, ``S S^T = H`` (module docstring)."""

    def factor_width(self, layout: Layout) -> int:
        """``K``: columns of the Hessian factor per position (one for elementwise losses)."""
        return 1

    @abstractmethod
    def torch_loss(
        self, output: torch.Tensor, target: torch.Tensor, reduction: Reduction
    ) -> torch.Tensor:
        """``L`` under ``reduction`` by torch's own function of the same name and options
        (``"sum"``: ``sum_ip m_ip l_ip``; ``"mean"``: that over ``M``, module docstring):
        differentiable in the output's dtype (float32 training and telemetry), where the
        closed forms above are the float64 references."""

    def torch_sum(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``sum_ip m_ip l_ip`` by torch's own function (:meth:`torch_loss`, ``"sum"``)."""
        return self.torch_loss(output, target, "sum")

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``L`` (module docstring), float64."""
        return self.terms(output, target).value(output)


@dataclass(frozen=True)
class CrossEntropy(Loss):
    """Softmax cross-entropy (``F.cross_entropy``); integer or probability targets."""

    name: ClassVar[str] = "cross_entropy"
    ignore_index: int = -100
    label_smoothing: float = 0.0
    class_dim: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.label_smoothing <= 1.0:
            raise FathomError(
                f"cross_entropy: label_smoothing={self.label_smoothing} must lie in [0, 1]"
            )

    def layout(self, shape: tuple[int, ...]) -> Layout:
        if len(shape) < 2:
            raise FathomError(
                f"the model must return logits shaped [N, classes]; it returned {list(shape)}, "
                "which has no class dimension for cross_entropy (a regression output: "
                "loss='mse'; one score per label: loss='bce_with_logits')"
            )
        if self.class_dim is None and len(shape) > 2:
            raise FathomError(
                f"the output {list(shape)} is not logits shaped [N, classes]: say where its "
                "classes are, class_dim=1 for PyTorch's [N, C, d1, ...] (as F.cross_entropy "
                "reads it, e.g. segmentation) or class_dim=-1 for [N, T, V] sequences"
            )
        cd = 1 if self.class_dim is None else self.class_dim
        if not -len(shape) <= cd < len(shape) or cd % len(shape) == 0:
            raise FathomError(
                f"class_dim={cd} does not name a class dimension of the output {list(shape)} "
                f"(dimension 0 holds the examples); use 1 .. {len(shape) - 1} or -1"
            )
        cd %= len(shape)
        c = shape[cd]
        if c < 2:
            raise FathomError(
                f"the model returned {c} logit(s) per example ([N, {c}]"
                f"{'' if len(shape) == 2 else f' at class_dim {cd}'}); with cross-entropy over "
                "one class every loss, gradient, GGN and Fisher is zero; return one score per "
                "class, at least two (a binary model: torch.cat([-z, z], dim=1)), or use "
                "loss='bce_with_logits' for one logit per label"
            )
        return Layout(tuple(shape), cd)

    def canon_target(self, layout: Layout, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(y, torch.Tensor):
            raise FathomError(f"cross_entropy: the target must be a tensor, got {type(y).__name__}")
        if y.is_floating_point():
            if tuple(y.shape) != layout.shape:
                raise FathomError(
                    f"cross_entropy: labels must be an integer tensor of shape "
                    f"{list(layout.position_shape)}, or probability targets a floating tensor "
                    f"of the output's shape {list(layout.shape)}; got {y.dtype} {list(y.shape)}"
                )
            if not bool(torch.isfinite(y).all()) or bool((y < 0).any()):
                raise FathomError(
                    "cross_entropy: probability targets must be finite and non-negative "
                    "(a distribution over the classes per position)"
                )
            t = layout.canon(y.to(torch.float64))
            return t, torch.ones(t.shape[:2], dtype=torch.bool, device=y.device)
        if y.dtype == torch.bool or y.is_complex() or tuple(y.shape) != layout.position_shape:
            raise FathomError(
                f"cross_entropy: labels must be an integer tensor of shape "
                f"{list(layout.position_shape)} for an output of shape {list(layout.shape)} "
                f"(class_dim {layout.class_dim}), got {y.dtype} {list(y.shape)}; probability "
                "targets are floating and have the output's shape"
            )
        flat = y.reshape(layout.n, -1).long()
        mask = flat != self.ignore_index
        c = layout.classes
        bad = mask & ((flat < 0) | (flat >= c))
        if bool(bad.any()):
            v = int(flat[bad][0])
            raise FathomError(
                f"labels must lie in [0, {c}) for {c} logits (or equal ignore_index="
                f"{self.ignore_index}); found {v}"
            )
        return flat, mask

    def factor_width(self, layout: Layout) -> int:
        return max(1, layout.classes - 1)

    def torch_loss(self, output, target, reduction):
        cd = 1 if self.class_dim is None else self.class_dim % output.dim()
        z = output.movedim(cd, 1)
        y = target.movedim(cd, 1) if target.is_floating_point() else target.long()
        return F.cross_entropy(
            z,
            y.to(z.dtype) if y.is_floating_point() else y,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            reduction=reduction,
        )

    def _target(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``t'`` ``[N, P, C]`` (module docstring)."""
        c = z.shape[-1]
        dense = t if t.is_floating_point() else F.one_hot(t.clamp_min(0), c).to(z.dtype)
        if self.label_smoothing:
            dense = (1 - self.label_smoothing) * dense + self.label_smoothing / c
        return dense

    def values(self, z, t):
        c = z.shape[-1]
        log_p = softmax_parts(z.reshape(-1, c)).log_p.reshape(z.shape)
        if not t.is_floating_point() and not self.label_smoothing:
            return -log_p.gather(-1, t.clamp_min(0)[..., None])[..., 0]
        return -(self._target(z, t) * log_p).sum(-1)

    def gradient(self, z, t):
        c = z.shape[-1]
        parts = softmax_parts(z.reshape(-1, c))
        p = parts.p.reshape(z.shape)
        if not t.is_floating_point() and not self.label_smoothing:
            idx = t.clamp_min(0)[..., None]
            one_minus = parts.one_minus_p.reshape(z.shape)
            return p.scatter(-1, idx, -one_minus.gather(-1, idx))  # p - e_y, exactly
        tt = self._target(z, t)
        return p * tt.sum(-1, keepdim=True) - tt

    def target_mass(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``sum_c t'_c`` per position ``[N, P]``, the factor of the Hessian (module
        docstring): one for integer labels, smoothed or not; ``(1 - eps) sum_c t_c + eps``
        for probability targets."""
        if not t.is_floating_point():
            return torch.ones(z.shape[:-1], dtype=z.dtype, device=z.device)
        return self._target(z, t).sum(-1)

    def hessian_sqrt(self, z, t):
        c = z.shape[-1]
        r = softmax_hessian_sqrt_reduced(softmax_parts(z.reshape(-1, c)))
        r = r.reshape(*z.shape, r.shape[-1])
        if t.is_floating_point():
            r = r * self.target_mass(z, t).sqrt()[..., None, None]
        return r


@dataclass(frozen=True)
class MSE(Loss):
    """Squared error (``F.mse_loss``), every output entry alone."""

    name: ClassVar[str] = "mse"

    def torch_loss(self, output, target, reduction):
        return F.mse_loss(output, target.to(output.dtype), reduction=reduction)

    def values(self, z, t):
        return (z - t).square()[..., 0]

    def gradient(self, z, t):
        return 2.0 * (z - t)

    def hessian_sqrt(self, z, t):
        return torch.full((*z.shape, 1), math.sqrt(2.0), dtype=z.dtype, device=z.device)


@dataclass(frozen=True)
class BCEWithLogits(Loss):
    """Binary cross-entropy on logits (``F.binary_cross_entropy_with_logits``), multi-label."""

    name: ClassVar[str] = "bce_with_logits"

    def torch_loss(self, output, target, reduction):
        t = target.to(output.dtype)
        return F.binary_cross_entropy_with_logits(output, t, reduction=reduction)

    def values(self, z, t):
        # softplus(z) = max(z, 0) + log1p(exp(-|z|)), exact at every z (F.softplus returns z
        # itself above its threshold 20, off by up to log1p(exp(-20)) ~ 2e-9)
        return (z.clamp_min(0) + torch.log1p(torch.exp(-z.abs())) - t * z)[..., 0]

    def gradient(self, z, t):
        return torch.sigmoid(z) - t

    def hessian_sqrt(self, z, t):
        return (torch.sigmoid(z) * torch.sigmoid(-z)).sqrt()[..., None]


LOSSES: dict[str, type[Loss]] = {k.name: k for k in (CrossEntropy, MSE, BCEWithLogits)}

NORMALIZATION = (
    "L = sum_i sum_p w_ip l(z_ip, y_ip) with w_ip = s m_ip: m_ip is 1 at a valid position and "
    "0 at one labelled ignore_index; s = 1/M for reduction='mean' (M the valid positions as "
    "torch counts them: valid labels for integer cross-entropy targets, N P for probability "
    "targets, N E entries for MSE and BCE) and 1 for 'sum'; c = 1/N (mean) or 1 (sum) and "
    "L_i = (1/c) sum_p w_ip l_ip is example i's loss (L = c sum_i L_i; one example is its "
    "whole output, a sequence or an image)"
)

LOSS_DEFINITIONS: dict[str, str] = {
    "cross_entropy": "l = -sum_c t'_c log softmax(z)_c with t' = (1 - eps) t + eps / C (t the "
    "one-hot label or the probability target); dl/dz = (sum t') p - t'; Hessian (sum t') "
    "(diag p - p p^T), factor sqrt(sum t') R with R the rank C - 1 reduced square root; "
    "positions labelled ignore_index weigh zero and are not counted by the mean",
    "mse": "l = (z - t)^2 per output entry (torch's mse_loss, no 1/2); dl/dz = 2 (z - t); "
    "Hessian 2, factor sqrt(2); the mean counts every entry",
    "bce_with_logits": "l = softplus(z) - t z per output entry (multi-label); dl/dz = sigmoid(z) "
    "- t; Hessian sigmoid(z) sigmoid(-z), factor its square root; the mean counts every entry",
}


def _did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def make_loss(loss: str | Loss = "cross_entropy", **options) -> Loss:
    """A :class:`Loss` from its name (:data:`LOSSES`) and options (``reduction``,
    ``ignore_index``, ``label_smoothing``, ``class_dim``; ``None`` values are left at their
    defaults), or ``loss`` itself (options given beside a :class:`Loss` replace its own)."""
    options = {k: v for k, v in options.items() if v is not None}
    if isinstance(loss, Loss):
        kind = type(loss)
        base = {f.name: getattr(loss, f.name) for f in fields(loss)}
    elif isinstance(loss, str) and loss in LOSSES:
        kind, base = LOSSES[loss], {}
    else:
        raise FathomError(
            f"unknown loss {loss!r}: choose from {', '.join(LOSSES)}"
            f"{_did_you_mean(str(loss), LOSSES)}"
        )
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise FathomError(
            f"loss {kind.name!r} takes no option {unknown[0]!r}; its options: {sorted(known)}"
            f"{_did_you_mean(unknown[0], known)}"
        )
    return kind(**{**base, **options})


@dataclass(frozen=True)
class Terms:
    """A :class:`Loss` read on one output shape against one target (module docstring):
    the layout, the canonical target ``[N, P]`` (labels) or ``[N, P, C]``, the valid
    positions ``mask [N, P]``, ``w_ip = weight * mask_ip``, and ``scale`` ``c`` (``1/N`` for
    the mean, ``1``: the per-example normalization of the empirical Fisher and the
    Jacobian Gram, ``L = c sum_i L_i``)."""

    loss: Loss
    layout: Layout
    target: torch.Tensor
    mask: torch.Tensor
    weight: Fraction
    scale: Fraction

    def take(self, start: int, stop: int) -> Terms:
        """The terms of examples ``start .. stop - 1`` (weights of the whole probe kept)."""
        n = min(stop, self.layout.n) - start
        return replace(
            self,
            layout=self.layout.with_examples(n),
            target=self.target[start:stop],
            mask=self.mask[start:stop],
        )

    def _z(self, output: torch.Tensor) -> torch.Tensor:
        if tuple(output.shape) != self.layout.shape:
            raise FathomError(
                f"{self.loss.name}: an output of shape {list(output.shape)} where the terms "
                f"were read on {list(self.layout.shape)}"
            )
        return self.layout.canon(output)

    def _target(self, output: torch.Tensor) -> torch.Tensor:
        t = self.target.to(output.device)
        return t.to(output.dtype) if t.is_floating_point() else t

    def weights(self, output: torch.Tensor) -> torch.Tensor:
        """``w_ip`` ``[N, P]`` in ``output``'s dtype."""
        m = self.mask.to(device=output.device, dtype=output.dtype)
        return m * float(self.weight)

    def losses(self, output: torch.Tensor) -> torch.Tensor:
        """``l_ip`` ``[N, P]`` (zero where masked, unweighted)."""
        z = self._z(output)
        values = self.loss.values(z, self._target(output))
        return torch.where(self.mask.to(z.device), values, torch.zeros_like(values))

    def value(self, output: torch.Tensor) -> torch.Tensor:
        """``L = sum_ip w_ip l_ip`` (the torch loss of the same name and options)."""
        total = self.losses(output).sum()
        return total / self.weight.denominator * self.weight.numerator

    def example_sum(self, output: torch.Tensor) -> torch.Tensor:
        """``sum_i L_i = L / c`` (``L_i = (1/c) sum_p w_ip l_ip``, example ``i``'s loss) by
        torch's own function, differentiable in the output's dtype: its gradient in example
        ``i``'s rows is ``dL_i/dz_i``. ``w / c`` is one where every position counts (then
        nothing is multiplied)."""
        total = self.loss.torch_sum(output, self.target_like(output))
        ratio = self.weight / self.scale
        return total if ratio == 1 else total * float(ratio)

    def target_like(self, output: torch.Tensor) -> torch.Tensor:
        """The target in the output's own layout (what torch's function takes)."""
        t = self.target.to(output.device)
        if not t.is_floating_point():
            return t.reshape(self.layout.position_shape)
        return self.layout.uncanon(t).to(output.dtype)

    def residual(self, output: torch.Tensor) -> torch.Tensor:
        """``dL/dz = w_ip dl_ip/dz_ip`` ``[N, *out]``."""
        z = self._z(output)
        g = self.loss.gradient(z, self._target(output)) * self.mask.to(z.device)[..., None]
        return self.layout.uncanon(g / self.weight.denominator * self.weight.numerator)

    def masked_gradient(self, output: torch.Tensor) -> torch.Tensor:
        """``m_ip dl_ip/dz_ip`` ``[N, *out]`` (the residual without the reduction's ``s``)."""
        z = self._z(output)
        g = self.loss.gradient(z, self._target(output)) * self.mask.to(z.device)[..., None]
        return self.layout.uncanon(g)

    def hessian_sqrt(self, output: torch.Tensor) -> torch.Tensor:
        """``m_ip F_ip`` ``[N, P, C, K]`` (unweighted factor, zero where masked)."""
        z = self._z(output)
        f = self.loss.hessian_sqrt(z, self._target(output))
        return f * self.mask.to(z.device)[..., None, None]

    def directions(self, output: torch.Tensor, scaled: bool = True) -> torch.Tensor:
        """The exact GGN output directions ``[D, N, *out]``, ``D = P K`` (module
        docstring); ``scaled=False`` leaves out ``sqrt(s)`` (``w = s m``)."""
        return self.position_directions(output, 0, self.layout.positions, scaled)

    def position_directions(
        self, output: torch.Tensor, start: int, stop: int, scaled: bool = True
    ) -> torch.Tensor:
        """The directions of positions ``start .. stop - 1`` only, ``[(stop - start) K, N, *out]``."""
        z = self._z(output)[:, start:stop]
        t = self._target(output)[:, start:stop]
        f = self.loss.hessian_sqrt(z, t) * self.mask[:, start:stop].to(z.device)[..., None, None]
        n, p, c, k = f.shape
        full = f.new_zeros(p, k, n, self.layout.positions, c)
        idx = torch.arange(p, device=f.device)
        full[idx, :, :, start + idx] = f.permute(1, 3, 0, 2)  # [p, K, N, C] at position start+p
        if scaled:
            full = full * math.sqrt(self.weight)
        return self.layout.uncanon(full.reshape(p * k, n, self.layout.positions, c))
