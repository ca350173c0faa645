"""A loss met by integer class labels: the run's ``[loss]`` table, its target encoding, once.

A classifier's data hold one integer label ``y_i in [0, C)`` per example and its model
returns logits ``z_i`` ``[C]``. The loss meets the label through a stated encoding
(``target``, :class:`fathom.config.run.LossConfig`):

* ``"labels"``: the label itself, cross-entropy's integer target (``ignore_index``,
  ``label_smoothing`` apply as in ``F.cross_entropy``);
* ``"one_hot"``: ``t_i = e_{y_i}`` in ``{0, 1}^C`` (float, one entry per logit), the target of
  ``mse`` (``l_i = sum_c (z_ic - t_ic)^2``) and ``bce_with_logits`` (``C`` independent binary
  labels, one-vs-rest: ``l_i = sum_c softplus(z_ic) - t_ic z_ic``).

Then, with ``L = c sum_i L_i`` (:mod:`fathom.losses.kinds`: ``c = 1/N`` for the mean, ``1``
for the sum; ``L_i = (1/c) sum_p w_ip l_ip`` example ``i``'s loss):

* the training step's loss is :meth:`LabelLoss.torch_value`, torch's own function in the
  logits' dtype (cross-entropy by default: exactly ``F.cross_entropy(z, y)``);
* a split's loss (``{split}/loss``) is :meth:`LabelLoss.split_sums` accumulated over its
  batches: ``sum_ip m_ip l_ip`` and ``M`` summed, then ``/ M`` for the mean: the loss of the
  whole split as one batch, float64;
* the audit's damage takes :meth:`LabelLoss.example_losses` ``L_i`` (float64).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F

from fathom.errors import FathomError
from fathom.losses.kinds import CrossEntropy, Loss, make_loss

if TYPE_CHECKING:
    from fathom.config.run import LossConfig

Target = Literal["labels", "one_hot"]
_TARGETS: tuple[str, ...] = ("labels", "one_hot")


@dataclass(frozen=True)
class LabelLoss:
    """``loss`` (:class:`~fathom.losses.kinds.Loss`) against integer class labels through the
    encoding ``target`` (module docstring); the default is ``F.cross_entropy``'s."""

    loss: Loss = field(default_factory=CrossEntropy)
    target: Target = "labels"

    def __post_init__(self) -> None:
        if self.target is not None and self.target not in _TARGETS:
            raise FathomError(
                f"target={self.target!r} is not a label encoding; use one of {list(_TARGETS)}"
            )
        if isinstance(self.loss, CrossEntropy):
            if self.target != "labels":
                raise FathomError(
                    "cross_entropy reads the class labels themselves: use target='labels'"
                )
            if self.loss.class_dim not in (None, 1):
                raise FathomError(
                    "a classifier's logits are [N, classes]: leave cross_entropy's class_dim unset"
                )
        elif self.target != "one_hot":
            raise FathomError(
                f"loss {self.loss.name!r} compares the logits with a floating target of their "
                "shape, and class labels are integers: state the encoding, target='one_hot' "
                '(t = e_y, one entry per class; [loss] target = "one_hot" in a run config, '
                "--target one_hot on the command line)"
            )

    @staticmethod
    def of(spec: LossConfig) -> LabelLoss:
        """The :class:`LabelLoss` of a run config's ``[loss]`` table
        (:class:`fathom.config.run.LossConfig`), through :func:`~fathom.losses.kinds.make_loss`."""
        options: dict[str, Any] = {"reduction": spec.reduction}
        if spec.name == "cross_entropy":
            options.update(ignore_index=spec.ignore_index, label_smoothing=spec.label_smoothing)
        return LabelLoss(make_loss(spec.name, **options), spec.target)

    @property
    def is_default(self) -> bool:
        """Plain cross-entropy with the mean (``F.cross_entropy(z, y)``, every run before ``[loss]``)."""
        return self == LabelLoss()

    def targets(self, y: torch.Tensor, classes: int, dtype: torch.dtype) -> torch.Tensor:
        """The loss's target for labels ``y`` ``[N]``: ``y`` itself, or ``e_y`` ``[N, classes]``
        in ``dtype``."""
        if self.target == "labels":
            return y
        if y.is_floating_point() or y.dim() != 1:
            raise FathomError(
                f"one-hot targets are made from a 1-D tensor of integer class labels, got "
                f"{y.dtype} {list(y.shape)}"
            )
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= classes):
            raise FathomError(
                f"labels range over [{int(y.min())}, {int(y.max())}] but the model returns "
                f"{classes} logits; one-hot targets need labels in [0, {classes})"
            )
        return F.one_hot(y.long(), classes).to(dtype)

    def torch_value(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``L`` of a batch by torch's own function, in the logits' dtype, differentiable (the
        training step's loss)."""
        t = self.targets(y, int(logits.shape[1]), logits.dtype)
        return self.loss.torch_loss(logits, t, self.loss.reduction)

    def split_sums(self, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
        """``(sum_ip m_ip l_ip, M)`` of a batch, float64 (closed forms); a split's loss is
        ``sum / M`` (mean) or ``sum`` over its batches' totals."""
        z = logits.to(torch.float64)
        terms = self.loss.terms(z, self.targets(y, int(z.shape[1]), torch.float64))
        return terms.losses(z).sum(), int(terms.mask.sum())

    def reduce(self, total: float, count: int) -> float:
        """A split's loss from its totals: ``total / count`` (mean) or ``total`` (sum)."""
        return total / count if self.loss.reduction == "mean" else total

    def example_losses(
        self, logits: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, Fraction]:
        """``(L_i [N], c)``, float64: example ``i``'s loss ``L_i = (1/c) sum_p w_ip l_ip`` and
        the scale ``c``, so that ``L = c sum_i L_i`` (module docstring)."""
        z = logits.to(torch.float64)
        terms = self.loss.terms(z, self.targets(y, int(z.shape[1]), torch.float64))
        ratio = terms.weight / terms.scale  # w / c: one where every position counts
        per = terms.losses(z).sum(1)
        return (per if ratio == 1 else per * float(ratio)), terms.scale

    def record(self) -> dict[str, Any]:
        """The loss as a JSON record: ``name``, its options and ``target``."""
        options = {f.name: getattr(self.loss, f.name) for f in fields(self.loss)}
        options.pop("class_dim", None)
        return {"name": self.loss.name, **options, "target": self.target}

    @staticmethod
    def from_record(record: dict[str, Any]) -> LabelLoss:
        """The inverse of :meth:`record` (a record as written to the audit's scores file):
        ``name`` and its options through :func:`~fathom.losses.kinds.make_loss`, ``target``."""
        options = dict(record)
        name, target = options.pop("name"), options.pop("target")
        return LabelLoss(make_loss(name, **options), target)

    def describe(self) -> str:
        """One line naming the loss and its options (``mse (mean, one-hot targets)``)."""
        r = self.record()
        extra = [f"{k}={r[k]}" for k in ("label_smoothing", "ignore_index") if k in r]
        extra = [e for e in extra if e not in ("label_smoothing=0.0", "ignore_index=-100")]
        enc = ", one-hot targets" if self.target == "one_hot" else ""
        return f"{r['name']} ({r['reduction']}{enc}{''.join(', ' + e for e in extra)})"
